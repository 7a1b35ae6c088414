from bench.server_counters import differences


def test_differences_flatten_nested_counters_and_skip_unmoved_ones():
    before = {"ssd_rounds": 10, "ssd_draft_server": {"hits": 4, "misses": 1}, "flag": True}
    after = {"ssd_rounds": 30, "ssd_draft_server": {"hits": 14, "misses": 1}, "flag": False, "new": 2}
    assert differences(before, after) == [
        "ssd_rounds: 30 (delta 20)", "ssd_draft_server.hits: 14 (delta 10)", "new: 2 (delta 2)"]
