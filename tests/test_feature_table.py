"""README.md's SGLang feature table is the one tests/e2e/features.py generates (the matrix it checks)."""

from pathlib import Path

from tests.e2e.features import feature_table

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- features:begin -->", "<!-- features:end -->"


def test_readme_feature_table_is_generated():
    text = README.read_text()
    assert BEGIN in text and END in text, "README.md lacks the feature table markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == feature_table(), "README.md's feature table is stale: paste tests.e2e.features.feature_table()"
