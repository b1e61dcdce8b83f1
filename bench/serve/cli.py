"""The `serve` and `tokenizer` subcommands (docs/serve.md)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys

from ..errors import InputError
from .activity import ServeActivity, say_starting
from .guard import api_keys_from

LOOPBACK = "127.0.0.1"


def add_serve_parsers(sub, number, cmd_serve, cmd_tokenizer) -> None:
    s = sub.add_parser(
        "serve", help="serve the OpenAI API in front of a scenario's cluster (in-process wall-paced, or on Ray)"
    )
    s.add_argument("scenario", nargs="?", default="serve", help="a scenario file or built-in name (default: serve)")
    s.add_argument(
        "--runtime",
        choices=["inproc", "ray"],
        help="inproc: one process, the virtual clock held to the wall clock; ray: node actors on a Ray cluster, "
        "the proxy actor serves HTTP (default: the scenario's runtime)",
    )
    s.add_argument(
        "--address", help="with --runtime ray: attach to a running Ray cluster (default: launch one on 127.0.0.1)"
    )
    s.add_argument("--variant", help="which of the scenario's variants' cluster to serve (default: the first)")
    s.add_argument(
        "--host",
        default=LOOPBACK,
        help="address to listen on (default 127.0.0.1: this machine only; another address is served, with a warning)",
    )
    s.add_argument("--port", type=number("int", 0, 65535), default=8000, help="port (default 8000; 0 = ephemeral)")
    s.add_argument("--model-name", default="disagg-sim", help="the model id clients name (default disagg-sim)")
    s.add_argument(
        "--time-scale",
        type=number("float", 0, 1e6, lo_open=True),
        default=1.0,
        metavar="X",
        help="wall seconds per modelled second (default 1: real time; 2 = the modelled GPU at half speed); "
        "on Ray it is the cluster's time_scale (step times only)",
    )
    s.add_argument(
        "--max-pending",
        type=number("int", 1, 1_000_000),
        default=512,
        metavar="N",
        help="requests in flight before new ones get 429 (default 512)",
    )
    s.add_argument(
        "--seed", type=number("int", 0, 2**31), default=None, help="sampler and link seed (default: the scenario's)"
    )
    s.add_argument(
        "--api-key",
        nargs="+",
        metavar="KEY",
        help="as vLLM: requests under /v1 must send 'Authorization: Bearer <one of these>' (else 401); "
        "/health and /metrics stay open (default: $VLLM_API_KEY, else none)",
    )
    s.set_defaults(func=cmd_serve)
    t = sub.add_parser("tokenizer", help="write the simulator's tokenizer as a Hugging Face tokenizer directory")
    t.add_argument("dir", help="directory to write tokenizer.json, tokenizer_config.json, special_tokens_map.json into")
    t.set_defaults(func=cmd_tokenizer)


def tokenizer_command(args) -> int:
    from .tokenizer import get_tokenizer

    if "\x00" in args.dir:
        raise InputError(f"tokenizer {args.dir!r}: holds a NUL byte; allowed: a directory path")
    try:
        out = get_tokenizer().export(args.dir)
    except OSError as exc:
        raise InputError(
            f"tokenizer {args.dir}: cannot write there ({exc.strerror}); allowed: a writable directory"
        ) from None
    print(f"wrote {out}/tokenizer.json, tokenizer_config.json, special_tokens_map.json (load with AutoTokenizer)")
    return 0


def _check_host(host: str, keyed: bool) -> None:
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise InputError(f"--host {host!r}: not an IP address; allowed: e.g. 127.0.0.1 or 0.0.0.0") from None
        return
    if not addr.is_loopback:
        # Asked for on purpose: say so, the more so without a key.
        how = "with an API key on /v1" if keyed else "no authentication"
        print(f"warning: serving on {host}: other machines can reach this server ({how})", file=sys.stderr)


def serve_command(args) -> int:
    from ..scenario import load_scenario
    from .server import build_app, serve_forever

    api_keys = api_keys_from(args.api_key, dict(os.environ))
    if args.api_key is not None and not api_keys:
        raise InputError("--api-key: empty; allowed: one or more non-empty keys")
    _check_host(args.host, bool(api_keys))
    scenario = load_scenario(args.scenario)
    variant = args.variant or scenario.variant_names[0]
    if variant not in scenario.variant_names:
        raise InputError(f"--variant {variant}: not in {scenario.name}; allowed: {', '.join(scenario.variant_names)}")
    spec = scenario.cluster(variant)
    if any(group.engine.engine != "v1" for group in (spec.prefill, spec.decode) if group.count):
        raise InputError(f"{scenario.name}: engine v0; allowed: serve runs v1 nodes only")
    seed = scenario.file.seed if args.seed is None else args.seed
    runtime = args.runtime or scenario.file.runtime
    if args.address is not None and runtime != "ray":
        raise InputError(
            f"--address {args.address}: only the Ray runtime attaches to a cluster; allowed: --runtime ray"
        )
    where = f"{scenario.name}/{variant}"
    if runtime == "ray":
        return _serve_on_ray(args, spec, seed, where, api_keys)
    say_starting(f"{where} in-process (its nodes, the tokenizer, the front door)")
    app = build_app(
        spec,
        args.model_name,
        seed=seed,
        time_scale=args.time_scale,
        max_pending=args.max_pending,
        api_keys=api_keys,
    )
    activity = ServeActivity()

    def ready(port: int) -> None:
        _say_ready(args, where, "in-process", port)

    async def serve_and_report() -> None:
        async def report() -> None:
            while True:
                await asyncio.sleep(activity.interval)
                activity.report(await app.driver.query("counts"))

        reporter = asyncio.create_task(report())
        try:
            await serve_forever(app, args.host, args.port, ready)
        finally:
            reporter.cancel()

    try:
        asyncio.run(serve_and_report())
    except OSError as exc:
        raise InputError(f"--port {args.port}: cannot listen on {args.host}:{args.port} ({exc.strerror})") from None
    finally:
        activity.close()
    return 0


def _say_ready(args, where: str, runtime: str, port: int) -> None:
    print(
        f"serving {where} as model {args.model_name!r} on http://{args.host}:{port}/v1 "
        f"({runtime}; time scale {args.time_scale:g}: wall seconds per modelled second); Ctrl-C stops",
        flush=True,
    )


def _serve_on_ray(args, spec, seed: int, where: str, api_keys: list[str]) -> int:
    """The cluster as Ray actors, the front door in the proxy actor; until Ctrl-C (or SIGTERM)."""
    import time

    from cluster.ray.cluster import RayClusterHandle

    from .ray_server import RayServer

    say_starting(
        f"{where} on Ray: "
        + (f"attaching to the cluster at {args.address}" if args.address else "a local Ray cluster on 127.0.0.1")
    )
    with RayClusterHandle(address=args.address) as handle:
        say_starting(f"{where} on Ray: the node actors and the proxy actor with the front door")
        try:
            server = RayServer(
                spec,
                handle,
                args.model_name,
                seed=seed,
                time_scale=args.time_scale,
                max_pending=args.max_pending,
                host=args.host,
                port=args.port,
                api_keys=api_keys,
            )
        except OSError as exc:  # raised in the proxy actor, where the front door binds
            raise InputError(f"--port {args.port}: cannot listen on {args.host}:{args.port} ({exc})") from None
        activity = ServeActivity()
        try:
            _say_ready(args, where, "Ray, " + handle.describe(), server.port)
            while True:
                time.sleep(activity.interval)
                try:
                    counts = server.query("counts")
                except Exception:  # only the status line is lost; the front door keeps serving
                    continue
                activity.report(counts)
        finally:
            activity.close()
            server.close()
