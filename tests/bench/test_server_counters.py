from bench.server_counters import differences


def test_differences_flatten_nested_counters_and_skip_unmoved_ones():
    before = {"ssd_rounds": 10, "ssd_draft_server": {"hits": 4, "misses": 1}, "flag": True}
    after = {"ssd_rounds": 30, "ssd_draft_server": {"hits": 14, "misses": 1}, "flag": False, "new": 2}
    assert differences(before, after) == [
        "ssd_rounds: 30 (delta 20)", "ssd_draft_server.hits: 14 (delta 10)", "new: 2 (delta 2)"]


def test_differences_of_number_lists_are_taken_elementwise():
    before = {"ssd_auto_k_chosen": [5, 1, 0], "ssd_auto_k_chosen_by_bucket": {"bucket1": [5, 1, 0]}}
    after = {"ssd_auto_k_chosen": [5, 3, 4], "ssd_auto_k_chosen_by_bucket": {"bucket1": [5, 1, 0], "bucket2": [0, 2, 4]}}
    assert differences(before, after) == [
        "ssd_auto_k_chosen: [5, 3, 4] (delta [0, 2, 4])",
        "ssd_auto_k_chosen_by_bucket.bucket2: [0, 2, 4] (delta [0, 2, 4])"]
