"""The server's warm-up: a prefill and decode steps, greedy and sampled, run
before /health answers, leaving the engine empty."""
from __future__ import annotations


def test_warm_up_prefills_and_decodes_then_leaves_the_engine_empty(tmp_path):
    from engine.core.engine_core import EngineCore
    from engine.core.engine_core_proc import warm_up
    from engine.tiny_model import make_tiny_model

    core = EngineCore(make_tiny_model(tmp_path / "tiny"), "float32", block_size=32,
                      num_kv_blocks=16, max_model_len=256, bind_threads=False)
    calls = []
    execute = core.executor.execute_model

    def record(seqs, is_prefill):
        calls.append((is_prefill, sorted(s.params.temperature for s in seqs)))
        return execute(seqs, is_prefill)

    core.executor.execute_model = record
    assert warm_up(core) > 0
    assert calls[0] == (True, [0.0, 1.0])  # one prefill of both, then batched decodes
    assert (False, [0.0, 1.0]) in calls
    assert not core.has_unfinished() and core.blocks.num_free == core.blocks.num_blocks
