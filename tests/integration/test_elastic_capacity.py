"""The elastic layout fills its rows before it refuses an admission.

Elastic sizing gives the logical block space every compress block the
tensors hold, most of them in the SWA space. SWA uses only a window per
sequence, so most SWA slots are never used early in a run; unless compress
may borrow those (borrow_unreleased_swa, which the elastic plan turns on),
it is stuck in its own region and the first admission is refused with the
pool nearly empty. A behavioural check on the demo's serving loop (the
accounting only, no timing): a CSA-only model, whose every tensor compress
can fill, under long prompts.
"""
from ukv_torch.demo.__main__ import MAX_NUM_BATCHED_TOKENS, plan_layout, workload_copy
from ukv_torch.demo.server import Server, ServerConfig
from ukv_torch.demo.workload import synthetic

RATIOS = [4]            # one CSA layer: every row is reachable by compress
BUDGET = 7 << 20        # 80 SWA slots and no own compress region at all
MAX_NUM_SEQS = 8


def without_lending(plan):
    """The same plan, its manager limited to the SWA slots SWA released: the
    unified layout that never borrows a slot SWA never used, on the plan's pools."""
    return plan.replace(config=plan.config.replace(layout="upstream"))


def util_at_first_refusal(plan):
    workload = synthetic(1, num_conversations=16, long_frac=0.6, long_range=(3072, 8192))
    server = Server("elastic", plan, workload_copy(workload),
                    ServerConfig(RATIOS, plan.config, check_integrity=False, seed=1))
    step = 0
    while not server.done() and server.result.first_refusal_util is None and step < 3000:
        server.step(step)
        step += 1
    server.finish_run()  # the manager's invariants hold
    assert server.result.first_refusal_util is not None, "the budget never ran out: the test sees nothing"
    return server.result.first_refusal_util


def test_elastic_layout_fills_its_rows_before_refusing():
    plan = plan_layout(BUDGET, RATIOS, "elastic", max_num_seqs=MAX_NUM_SEQS,
                       max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, swa_sizing="upstream")
    assert plan.mode == "elastic"  # the layout whose manager lends never-used SWA slots to compress
    assert plan.type_slots == (plan.num_swa_blocks,)  # every compress block lives in the SWA space
    # The refused request needs 52 blocks while 49 are free: the rest of the
    # gap is one request's size, not stranded rows.
    assert util_at_first_refusal(plan) >= 0.8
    # Without the option compress cannot take a single SWA slot SWA never used.
    assert util_at_first_refusal(without_lending(plan)) <= 0.1
