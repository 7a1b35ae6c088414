"""The feature matrix: each SGLang serving feature on the SSD server against the AR server.

Greedy features must give the same answer (tokens, text, finish reason, logprobs to 1e-3); a feature
SSD does not serve must be refused with a one-line error, never crash the server. The table in
README.md is generated from ``tests/e2e/features.py`` (``test_readme_feature_table``). Prints:
``features: N checked, M same as AR, R refused with a clear error, 0 crashes``.
"""

from __future__ import annotations

import pytest

from tests.e2e import features as F

pytestmark = pytest.mark.server


def alive(server) -> bool:
    """The process runs and a real generation answers (SGLang's /health_generate)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{server.url}/health_generate", timeout=120) as r:
            return server.proc.poll() is None and r.status == 200
    except OSError:
        return False


def test_feature_matrix(feature_ar_server, feature_ssd_server, feature_context):
    ar, ssd = feature_ar_server.url, feature_ssd_server.url
    greedy_ar = F.run_case(F.FEATURES[0], ar, feature_context)
    same, refused, problems = 0, 0, []
    for feature in F.FEATURES:
        want = F.run_case(feature, ar, feature_context)
        got = F.run_case(feature, ssd, feature_context)
        assert want[0] == "ok", f"{feature.name}: the AR server refused it: {want[1]}"
        if feature.changes_greedy:  # otherwise the case would pass without exercising the feature
            assert want != greedy_ar, f"{feature.name}: AR's answer equals plain greedy; the case tests nothing"
        if feature.expected == "same":
            same += got == want
            if got != want:
                problems.append(f"{feature.name}: AR {want!r} != SSD {got!r}")
        else:
            ok = got[0] == "refused" and "\n" not in got[1] and got[1]
            refused += bool(ok)
            if not ok:
                problems.append(f"{feature.name}: expected a one-line refusal under SSD, got {got!r}")
        if not alive(feature_ssd_server):
            pytest.fail(f"the SSD server died on {feature.name!r}")
    # F.OWN_SERVER (their own server, test_tokenizer_workers_and_skip_tokenizer_init) count in the line too.
    print(f"\nfeatures: {len(F.FEATURES) + len(F.OWN_SERVER)} checked, {same + len(F.OWN_SERVER)} same as AR, {refused} refused with a clear "
          f"error, 0 crashes")
    assert not problems, "\n".join(problems)


def test_tokenizer_workers_and_skip_tokenizer_init(workers_server, feature_ar_server, equality_prompts):
    """SSD with --tokenizer-worker-num 4 and --skip-tokenizer-init starts, and its greedy token ids equal
    AR's (several requests, so more than one worker process answers)."""
    for ids in equality_prompts[:6]:
        sp = {"temperature": 0, "max_new_tokens": 12}
        want = feature_ar_server.generate(ids, sp)["output_ids"]
        assert workers_server.generate(ids, sp)["output_ids"] == want


def test_input_embeds_bad_rows_are_refused(feature_ssd_server, feature_context):
    """Rows of the wrong width, non-finite values or non-numbers: a 400 with one line, the server lives."""
    hidden = len(feature_context["embeds"][0])
    for rows in ([[0.1] * (hidden - 1)], [[float("inf")] * hidden], [["x"] * hidden], []):
        with pytest.raises(F.Refused) as err:
            F.post(feature_ssd_server.url, "/generate", {"input_embeds": rows, "sampling_params": {"max_new_tokens": 2}})
        assert err.value.status == 400 and "\n" not in err.value.message
    assert alive(feature_ssd_server)


def test_request_fanout_is_bounded(feature_ssd_server):
    """n = 10^6 once left the server unanswering for minutes (SGLang expands n before any check)."""
    from sglang_ssd.target.serving_guards import MAX_SEQUENCES_PER_REQUEST

    with pytest.raises(F.Refused) as err:
        F.gen(feature_ssd_server.url, F.greedy({"n": 10**6}))
    assert err.value.status == 400 and str(MAX_SEQUENCES_PER_REQUEST) in err.value.message
    assert alive(feature_ssd_server)
