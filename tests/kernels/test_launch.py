"""The decision table (``kernels.launch``): the design, tiles and register budget a shape
gets, a bad forced design named, and a design chosen once per shape, target and setting."""

from __future__ import annotations

import pytest

import kernels.launch

pytestmark = pytest.mark.gpu


def test_design_table_follows_pair_count():
    """K3 per TP8 rank (H=12) on the H200 the table is tuned on. Verify: one token at a time up
    to B=8 at T=4 and B=4 at T=8, one kernel up to B=16, two from B=17. Flushing: up to B=2
    the flush apart; one token at a time up to B=8 at T=4 and B=4 at T=8, else two kernels.
    Commit: one token at a time up to B=32 at T=4 and B=8 at T=8 (never past B=32),
    then the fold operand in every V-tile up to B=10, once from B=11, 64 key channels a
    program from B=43."""
    def designs(op_config, batches, T, **kw):
        return [op_config(b, 12, 128, 128, T, **kw).design for b in batches]

    verify, commit = kernels.launch.verify_config, kernels.launch.commit_config
    assert designs(verify, (8, 9, 16, 17, 85, 86), 4) == [
        "token-loop", "one-pass", "one-pass", "two-kernels", "two-kernels", "two-kernels"]
    assert designs(verify, (4, 5), 8) == ["token-loop", "one-pass"]
    assert designs(verify, (1, 2, 3, 8, 9), 4, flush=True) == [
        "flush-apart", "flush-apart", "token-loop-token-by-token", "token-loop-token-by-token", "two-kernels"]
    assert designs(verify, (1, 2, 3, 4, 5), 8, flush=True) == [
        "flush-apart", "flush-apart", "token-loop-token-by-token", "token-loop-token-by-token", "two-kernels"]
    assert designs(commit, (32, 33), 4) == ["token-loop", "fold-operand-once"]
    assert designs(commit, (8, 9, 10, 11, 42, 43), 8) == [
        "token-loop", "fold-in-tile", "fold-in-tile", "fold-operand-once", "fold-operand-once",
        "fold-operand-once-wide"]
    assert designs(commit, (33,), 1) == ["fold-operand-once"]
    # the same pairs per SM on a GPU of half the SMs: half the batch
    half = kernels.launch.Target(compiled=True, sm_count=66)
    assert designs(verify, (4, 5, 8, 9), 4, target=half) == ["token-loop", "one-pass", "one-pass", "two-kernels"]


def test_design_tiles():
    """State rows per program: the stock token loop 4 at T=4, at T=8 2 up to B=2, then 8 (the
    flush apart's too, to B=2); the flushing one 8 at T=4, 4 at T=8; under the
    interpreter (programs one after another) 32 and 16. The commit's token loop 4 up to
    B=4, 8 up to B=8, then 16 (32 under the interpreter). The flushing two kernels on 32-row
    one-warp tiles."""
    verify, commit = kernels.launch.verify_config, kernels.launch.commit_config
    interpreter = kernels.launch.INTERPRETER
    assert verify(8, 12, 128, 128, 4).block_v == 4
    assert [verify(b, 12, 128, 128, 8).block_v for b in (1, 2, 3, 4)] == [2, 2, 8, 8]
    assert [verify(b, 12, 128, 128, 4, flush=True).block_v for b in (2, 3, 8)] == [4, 8, 8]
    assert [verify(b, 12, 128, 128, 8, flush=True).block_v for b in (2, 3, 4)] == [2, 4, 4]
    assert [verify(b, 12, 128, 128, 4, flush=True).window_at_once for b in (2, 3)] == [True, False]
    assert verify(1, 12, 128, 128, 8, target=interpreter).block_v == 32
    assert {verify(b, 12, 128, 128, 4, flush=True, target=interpreter).block_v for b in (1, 2, 3)} == {16}
    assert [commit(b, 12, 128, 128, 4).block_v for b in (1, 4, 5, 8, 9, 32)] == [4, 4, 8, 8, 16, 16]
    assert commit(1, 12, 128, 128, 4, target=interpreter).block_v == 32
    for flushing in (verify(5, 12, 128, 128, 8, flush=True), verify(9, 12, 128, 128, 4, flush=True)):
        assert (flushing.design, flushing.block_v, flushing.num_warps) == ("two-kernels", 32, 1)


def test_token_loops_take_a_register_budget():
    """Every token loop runs under a budget of 168 registers but the flushing verify on 8 state
    rows up to 64 pairs and the commit on 4 rows from 25 pairs and on 16 past 192."""
    verify, commit = kernels.launch.verify_config, kernels.launch.commit_config
    assert {verify(b, 12, 128, 128, t).max_registers for b, t in ((1, 4), (2, 4), (8, 4), (1, 8), (4, 8))} == {168}
    assert [verify(b, 12, 128, 128, 4, flush=True).max_registers for b in (1, 2, 3, 5, 6, 8)] == [
        168, 168, None, None, 168, 168]
    assert {verify(b, 12, 128, 128, 8, flush=True).max_registers for b in (2, 4)} == {168}
    budgets = [commit(b, 12, 128, 128, 4).max_registers for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32)]
    assert budgets == [168, 168, None, None, 168, 168, 168, 168, None, None]


@pytest.mark.parametrize("value, message", [
    ("verify=fast", "unknown verify design 'fast'"), ("prefill=one-pass", "unknown op 'prefill'")])
def test_a_bad_forced_design_is_named(monkeypatch, value, message):
    monkeypatch.setenv(kernels.launch.DESIGN_ENV, value)
    with pytest.raises(ValueError, match=message):
        kernels.launch.verify_config(1, 1, 16, 16, 1)


def test_a_design_is_chosen_once_per_shape_target_and_setting(monkeypatch):
    """Repeated calls of one shape on one target walk the table once; another ``KDA_DESIGN``
    value is parsed and chosen again, and the first value's choice is still kept."""
    launch = kernels.launch
    walked = []
    counted = tuple(launch.Rule(rule.design, lambda key, rule=rule: walked.append(rule.design) or rule.holds(key),
                                rule.why) for rule in launch._RULES["verify"])
    monkeypatch.setitem(launch._RULES, "verify", counted)
    monkeypatch.delenv(launch.DESIGN_ENV, raising=False)
    launch._chosen_design.cache_clear()
    launch._parse_designs.cache_clear()
    shape = (8, 12, 128, 128, 4)
    assert [launch.verify_config(*shape).design for _ in range(3)] == ["token-loop"] * 3
    assert walked == ["token-loop"]
    assert launch._chosen_design.cache_info()[:2] == (2, 1)  # hits, misses
    assert launch.verify_config(*shape, target=launch.INTERPRETER).design == "token-loop"
    assert walked == ["token-loop"] * 2  # another target, chosen again
    monkeypatch.setenv(launch.DESIGN_ENV, "verify=two-kernels")
    assert [launch.verify_config(*shape).design for _ in range(2)] == ["two-kernels"] * 2
    assert launch._parse_designs.cache_info().misses == 2  # "" and "verify=two-kernels", once each
    monkeypatch.delenv(launch.DESIGN_ENV)
    assert launch.verify_config(*shape).design == "token-loop"
    assert walked == ["token-loop"] * 2
    assert launch._chosen_design.cache_info()[:2] == (4, 3)
