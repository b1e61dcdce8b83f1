"""Where a request's first token went: its TTFT cut at the moments the
proxy learns of, so the parts add up to the TTFT by construction (each part
is the time from the previous moment present to its own; a moment a
request never had, e.g. a KV load in an aggregated run, gives a 0 part).

    part                   ends at
    front_end              the API server is done with the request (parse, template, tokenize, IPC)
    proxy_prefill_request  the prompt-only request leaves for a prefill node
    queue                  a node first schedules the request (prefill node in
                           P/D; the only node when aggregated)
    prefill                the prefill's output (with `kv_transfer_params`)
                           reaches the proxy; aggregated (no prefill node):
                           the first token reaches the proxy
    proxy_decode_request   the request, with those params, leaves for a decode node
    decode_queue           the decode node starts the KV load (it received the
                           request and a step scheduled the load)
    transfer               every block is in (handshake, metadata, the read,
                           retries)
    decode_admission       the decode node schedules the request (the load's
                           end is reported, the request promoted)
    first_decode_step      its first token reaches the proxy (the first-token
                           recompute step and the node's output link)
    to_client              the client has it (IPC back; the node's API server streams its batch)

Times are the proxy's (`now`) and, for `queue`, `decode_queue`, `transfer`
and `decode_admission`'s ends, the node's clock: in-process one clock; on
Ray clocks agree to microseconds on one machine, so a part may be off by
that, never the sum.
"""

from __future__ import annotations

PARTS = (
    "front_end",
    "proxy_prefill_request",
    "queue",
    "prefill",
    "proxy_decode_request",
    "decode_queue",
    "transfer",
    "decode_admission",
    "first_decode_step",
    "to_client",
)


def breakdown(arrival: float, marks: dict[str, float], first_token: float) -> dict[str, float]:
    """The TTFT `first_token - arrival` in `PARTS`; `marks` maps a part to
    the time it ended (missing: the request had no such moment)."""
    out: dict[str, float] = {}
    last = arrival
    for part in PARTS[:-1]:
        end = marks.get(part)
        if end is None:
            out[part] = 0.0
        else:
            out[part] = end - last
            last = end
    out["to_client"] = first_token - last
    return out
