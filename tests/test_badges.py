"""Badges: one owner/repo setting, every badge points at its own notebook."""
import json
import re
import shutil

from course_utils.course import paths as _course
from course_utils.course import badges

ROOT = badges.ROOT
BADGE_URL = re.compile(r"https://colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/([^/]+)/notebooks/([^)\s]+)")


def test_badges_and_install_cells_are_up_to_date():
    assert badges.check() == [], "run `make badges`"


def test_every_notebook_badge_points_at_itself():
    for path in badges.notebook_paths():
        first = json.loads(path.read_text())["cells"][0]
        assert first["cell_type"] == "markdown"
        urls = BADGE_URL.findall("".join(first["source"]))
        assert urls == [(_course.GITHUB_REPO, _course.BRANCH, path.name)], path.name


def test_readme_lists_every_notebook_with_its_own_badge():
    readme = (ROOT / "README.md").read_text()
    found = {nb: repo for repo, _, nb in BADGE_URL.findall(readme)}
    for path in badges.notebook_paths():
        assert found.get(path.name) == _course.GITHUB_REPO, path.name
    assert set(found) <= {p.name for p in badges.notebook_paths()}


def test_owner_repo_is_written_in_one_place():
    owner_repo = _course.GITHUB_REPO
    sources = [p for p in ROOT.rglob("*") if p.suffix in {".py", ".toml", ".yml", ".cfg", "Makefile"}
               and ".venv" not in p.parts and p.is_file()]
    holders = [p.relative_to(ROOT) for p in sources if owner_repo in p.read_text(errors="ignore")]
    assert [str(p) for p in holders] == ["course_utils/course/paths.py"]


def test_one_command_rewrites_everything(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    old = _course.GITHUB_REPO
    monkeypatch.setattr(_course, "GITHUB_REPO", "someone/their-fork")
    assert badges.check(tmp_path)  # everything is now stale
    changed = badges.rewrite(tmp_path)
    assert "README.md" in changed and badges.check(tmp_path) == []
    for path in [tmp_path / "README.md", *badges.notebook_paths(tmp_path)]:
        text = path.read_text()
        assert old not in text
        assert "someone/their-fork" in text
    nb0 = (tmp_path / "notebooks" / "00_orientation.ipynb").read_text()
    assert 'REPO, BRANCH = \\"someone/their-fork\\", \\"main\\"' in nb0
