"""Recognising steady decode (engine/steady_decode.py, `steady_batch`):
what it reads of the running batch, and the per-epoch request checks
(`Scheduler.steady_epoch`, `Request.steady_epoch`)."""

from __future__ import annotations

from engine.config import CacheConfig, SchedulerConfig
from engine.node_core import NodeCore, NodeSpec
from engine.steady_decode import block_plan, steady_batch
from engine.testing import create_requests


def _core_in_steady_decode(n: int = 3, prompt: int = 20, max_tokens: int = 50) -> NodeCore:
    core = NodeCore(
        NodeSpec(
            "n",
            None,
            scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512),
            cache=CacheConfig(num_gpu_blocks=100, block_size=16, enable_prefix_caching=False),
            shadow_kv=False,
        )
    )
    for r in create_requests(n, num_tokens=prompt, max_tokens=max_tokens, ignore_eos=True):
        core.add_request(r)
    for t in range(2):  # the prefill, then one decode step: every request now decodes one token a step
        plan = core.schedule_step(float(t))
        assert plan is not None
        core.process_oldest(core.finish_step(plan, float(t)))
    return core


def test_the_batch_carries_what_every_later_pass_reads():
    core = _core_in_steady_decode()
    batch = steady_batch(core)
    assert batch is not None
    running = core.scheduler.running
    assert batch.requests == running and batch.ids == [r.request_id for r in running]
    # 20 prompt tokens + 2 outputs: 21 computed, 2 outputs so far, 48 steps to go.
    assert batch.computed == [21, 21, 21] and batch.context == 63
    assert batch.firsts == [2, 2, 2] and batch.finish_step == [48, 48, 48]
    # 2 blocks of 16 hold 21 computed tokens; step j needs 21 + j slots: a block at step 12.
    assert batch.held == [2, 2, 2] and batch.block_due == [12, 12, 12]
    per_step, finishing, fits = block_plan(core, batch, 30)
    assert per_step[12] == [0, 1, 2] and per_step[28] == [0, 1, 2] and fits == 30
    assert not any(finishing)


def test_the_request_checks_run_once_per_scheduler_epoch():
    core = _core_in_steady_decode()
    s = core.scheduler
    assert steady_batch(core) is not None
    epoch = s.steady_epoch
    assert all(r.steady_epoch == epoch for r in s.running)
    # A plain step starts a new epoch, and the requests are checked again.
    plan = core.schedule_step(2.0)
    assert plan is not None and s.steady_epoch == epoch + 1
    core.process_oldest(core.finish_step(plan, 2.0))
    s.running[1].sampling_params.stop_token_ids = [7]  # it could now stop on a sampled token
    assert steady_batch(core) is None
    s.running[1].sampling_params.stop_token_ids = []
    assert steady_batch(core) is not None
    assert all(r.steady_epoch == epoch + 1 for r in s.running)


def test_a_request_out_of_step_is_no_steady_batch_whatever_the_epoch():
    core = _core_in_steady_decode()
    assert steady_batch(core) is not None
    r = core.scheduler.running[0]
    r.num_computed_tokens -= 1  # a token to catch up on: not one-token-a-step decode
    assert steady_batch(core) is None
