"""`disagg-sim validate`, `schema` and `scenarios`: about scenarios, without running one."""

from __future__ import annotations


def add_parsers(sub) -> None:
    v = sub.add_parser("validate", help="check a scenario completely (traces, thresholds, sizes) without running it")
    v.add_argument("scenario")
    v.set_defaults(func=cmd_validate)
    sc = sub.add_parser("schema", help="the scenario format reference (Markdown), its JSON schema, or metric names")
    g = sc.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="the JSON schema of a scenario file")
    g.add_argument("--metrics", metavar="SCENARIO", help="every metric name this scenario's results carry")
    g.add_argument(
        "--glossary", action="store_true", help="every metric's definition, unit and vLLM equivalent (docs/metrics.md)"
    )
    sc.set_defaults(func=cmd_schema)
    s = sub.add_parser("scenarios", help="list the built-in scenarios")
    s.set_defaults(func=cmd_scenarios)


def cmd_validate(args) -> int:
    from ..scenario import load_scenario

    s = load_scenario(args.scenario)
    print(
        f"{s.name}: ok ({len(s.variants)} variants: {', '.join(s.variant_names)}; runtime {s.file.runtime}; "
        f"{s.file.repeats} repeat(s); {len(s.file.thresholds)} threshold(s))"
    )
    return 0


def cmd_schema(args) -> int:
    from ..schema_doc import reference, scenario_json_schema

    if args.metrics:
        from ..scenario import load_scenario

        print("\n".join(sorted(load_scenario(args.metrics).known_metrics())))
    elif args.glossary:
        from ..metric_glossary import documented_names, render_markdown

        print(render_markdown(documented_names()), end="")
    elif args.json:
        import json

        print(json.dumps(scenario_json_schema(), indent=2))
    else:
        print(reference(), end="")
    return 0


def cmd_scenarios(args) -> int:
    from ..scenario import builtin_scenarios, load_scenario

    for name in builtin_scenarios():
        s = load_scenario(name)
        first = (s.file.description.strip().splitlines() or [""])[0]
        print(f"{name:24s} {s.file.runtime:7s} {first}")
    return 0
