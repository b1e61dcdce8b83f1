"""`vllm bench serve` from the vLLM oracle venv, without the `vllm` CLI entry
point (which imports the whole server and needs packages the oracle venv
does not carry): the benchmark's own argument parser and `main`, as the CLI
calls them. Run with the oracle's interpreter; arguments as `vllm bench serve`."""

import argparse

from vllm.benchmarks.serve import add_cli_args, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args())
