"""README.md stays true: its settings table is the one the settings classes produce."""

from __future__ import annotations

from kvgate import REPO_ROOT
from kvgate.settings_table import END, START, readme_block


def test_readme_settings_table_matches_the_settings_classes():
    readme = (REPO_ROOT / "README.md").read_text()
    assert START in readme and END in readme
    current = readme[readme.index(START) : readme.index(END) + len(END)]
    assert current == readme_block(), "regenerate: python -m kvgate.settings_table > the README block"


def test_every_setting_says_what_it_does():
    undocumented = [row.split("|")[1].strip() for row in readme_block().splitlines()[3:-1] if row.endswith("|  |")]
    assert not undocumented
