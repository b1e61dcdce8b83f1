"""Copy the in-sample fit of `disagg-sim validate-cost --fit` (bench/validation/fitted.json)
into the shipped data: each GPU's `efficiency` (its class's factors, the weight reads' efficiency,
the host terms and the fixed times per layer) in engine/data/gpus.json, and the `vllm-0.11` API-server preset in
engine/data/front_end.json.
tests/bench/test_validation.py checks they agree."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from bench.validation.fit import load_fitted

ROOT = Path(__file__).resolve().parents[1]
SOURCE = (
    "fitted by `disagg-sim validate-cost --fit` on published vLLM runs (bench/validation/published.yaml and "
    "independent.yaml, in-sample fit in bench/validation/fitted.json); leave-one-source-out errors in "
    "docs/validation.md"
)


def main() -> None:
    fitted = load_fitted()["in_sample"]
    gpus_path = ROOT / "engine/data/gpus.json"
    gpus = json.loads(gpus_path.read_text())
    for name, gpu in gpus.items():
        if name.startswith("_"):
            continue
        factors = {**fitted.classes.get(gpu["gpu_class"], {}), **fitted.weights, **fitted.host, **fitted.layers}
        gpu["efficiency"] = factors
        cls = gpu["gpu_class"]
        which = (
            f"{cls} class factors, weight reads' efficiency, host terms and fixed times per layer"
            if cls in fitted.classes
            else "weight reads' efficiency, host terms and fixed times per layer (class not fitted)"
        )
        gpu["efficiency_source"] = f"{which} {SOURCE}"
    gpus_path.write_text(json.dumps(gpus, indent=2) + "\n")
    fe_path = ROOT / "engine/data/front_end.json"
    fe = json.loads(fe_path.read_text())
    fe["vllm-0.11"] = {
        "source": "request_ms, output_token_us and ipc_ms " + SOURCE + "; prompt_token_us 1.3 from "
        "https://github.com/vllm-project/vllm/pull/19334 (100 x 10,000-token prompts tokenized in 1.338 s)",
        **asdict(fitted.front_end),
    }
    fe_path.write_text(json.dumps(fe, indent=2) + "\n")


if __name__ == "__main__":
    main()
