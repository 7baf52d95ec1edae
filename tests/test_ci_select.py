"""tools/ci_select.py: what a CI run's nets run. Any 3 consecutive submissions cover every mutant
and every sanitizer test; a change reaches the mutants of the files that include it; the marker
is refused when stale. Run on a scratch git repository, so that no checkout's history matters."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ci_select  # noqa: E402


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository with csrc/ops/common.h, included by csrc/ops/adam.h, included by csrc/cpu/loops.h,
    and csrc/cpu/other.h; ci_select pointed at it."""
    files = {"csrc/ops/common.h": "#pragma once\n", "csrc/ops/adam.h": '#include "ops/common.h"\n',
             "csrc/cpu/loops.h": '#include "ops/adam.h"\n', "csrc/cpu/other.h": "// alone\n",
             "tests/test_a.py": "", "tests/test_b.py": ""}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    monkeypatch.setattr(ci_select, "ROOT", str(tmp_path))
    monkeypatch.setenv("FUSED_AMP_CI_SELECT", "changed")
    return tmp_path


def commit(repo, path, text):
    (repo / path).write_text(text)
    git(repo, "add", path)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", path)


def test_three_consecutive_counters_cover_every_key_once():
    keys = [f"cpu/x.h|+ to - in f|line {i}" for i in range(300)]
    shares = [{k for k in keys if ci_select.in_rotation(k, counter)} for counter in (7, 8, 9)]
    assert set().union(*shares) == set(keys)
    assert sum(len(s) for s in shares) == len(keys)  # each in one share only
    assert all(len(s) > 50 for s in shares)  # and the shares are about a third each


def test_a_changed_header_reaches_the_files_that_include_it(repo):
    base = git(repo, "rev-parse", "HEAD")
    ci_select.mark(base)
    commit(repo, "csrc/ops/common.h", "#pragma once\n// changed\n")
    selection = ci_select.MutantSelection()
    assert selection.why("cpu/loops.h", "k") == "file changed"  # through ops/adam.h
    assert selection.why("ops/adam.h", "k") == "file changed"
    other = "cpu/other.h|loop one short|for (;;)"
    assert selection.why("cpu/other.h", other) == ("rotation" if ci_select.in_rotation(other, 1) else None)


def test_a_mutant_runs_when_its_recorded_killer_changed(repo):
    ci_select.mark(git(repo, "rev-parse", "HEAD"))
    commit(repo, "tests/test_b.py", "# changed\n")
    key = next(f"cpu/other.h|m|{i}" for i in range(100) if not ci_select.in_rotation(f"cpu/other.h|m|{i}", 1))
    assert ci_select.MutantSelection({key: "tests/test_a.py::t"}).why("cpu/other.h", key) is None
    assert ci_select.MutantSelection({key: "tests/test_b.py::t"}).why("cpu/other.h", key) == "killer changed"


def test_without_the_rotation_only_the_changed_files_run(repo, monkeypatch):
    monkeypatch.setenv("FUSED_AMP_CI_SELECT", "local")
    ci_select.mark(git(repo, "rev-parse", "HEAD"))
    assert all(ci_select.MutantSelection().why("cpu/other.h", f"k{i}") is None for i in range(30))
    monkeypatch.delenv("FUSED_AMP_CI_SELECT")
    assert ci_select.MutantSelection().why("cpu/other.h", "k") == "all"


def test_the_sanitizers_run_changed_tests_whole_and_a_share_of_the_rest(repo):
    ci_select.mark(git(repo, "rev-parse", "HEAD"))
    commit(repo, "tests/test_b.py", "# changed\n")
    whole, share = ci_select.sanitize_selection(["tests/test_a.py", "tests/test_b.py"])
    assert whole == ["tests/test_b.py"] and share == "1/3"


def test_a_stale_marker_is_refused_and_mark_makes_it_current(repo):
    first = git(repo, "rev-parse", "HEAD")
    assert "no last_ci_passed" in ci_select.problem()
    ci_select.mark(first)
    assert ci_select.problem() is None and ci_select.marker()["counter"] == 1
    commit(repo, ".ci/submission", (repo / ".ci/submission").read_text())  # submission 1 lands
    landed = git(repo, "rev-parse", "HEAD")
    ci_select.mark(landed)  # the next submission
    assert ci_select.marker()["counter"] == 2 and ci_select.problem() is None
    (repo / ".ci/submission").write_text(f"last_ci_passed = {landed}\ncounter = 5\n")
    assert "counter is 5, 2 for a submission" in ci_select.problem()



def test_a_check_is_due_when_its_files_change_or_a_file_is_added_under_its_paths(repo, monkeypatch, capsys):
    ci_select.mark(git(repo, "rev-parse", "HEAD"))
    monkeypatch.setattr(ci_select, "in_rotation", lambda key, counter: False)
    due = ["due", "sdist", "setup.py", "--new-under", "csrc/"]
    assert ci_select.main(due) == 1  # nothing changed, not its turn
    commit(repo, "csrc/cpu/other.h", "// edited\n")
    assert ci_select.main(due) == 1  # an edit under csrc/ is not a new file
    (repo / "csrc/cpu/new.h").write_text("// new\n")
    assert ci_select.main(due) == 0 and "csrc/cpu/new.h" in capsys.readouterr().out
    (repo / "csrc/cpu/new.h").unlink()
    git(repo, "rm", "-q", "csrc/cpu/other.h")
    assert ci_select.main(due) == 0  # a removed file too
    git(repo, "reset", "-q", "--hard")
    (repo / "setup.py").write_text("# changed\n")
    assert ci_select.main(due) == 0
