"""What a submission's CI runs of the slow nets (mutants, sanitizers): what its commits changed,
plus a third of the rest, chosen by the submission counter, so that any 3 consecutive CI runs
cover everything (docs/development.md, "CI's budget").

The marker .ci/submission holds two lines, which the submitter updates once per submission
(`make ci-mark`; CI runs on a clean clone and cannot commit):
    last_ci_passed = <the last commit CI passed on: HEAD of a session's fresh checkout>
    counter = <that commit's counter + 1>

    python3 tools/ci_select.py check [--local]  # the marker is current (CI's first step;
                                              # --local: and names this checkout's start, or
                                              # for a checkout that lived on, a commit after it)
    python3 tools/ci_select.py mark [COMMIT]  # write it (COMMIT: default, the checkout's start)
    python3 tools/ci_select.py changed        # the files changed since last_ci_passed
    python3 tools/ci_select.py sanitize-share TEST...  # what the sanitizers run of those tests
    python3 tools/ci_select.py due NAME PATH... [--new-under PATH...]
        # exit 0: a check of PATHs runs (one changed, a file added, removed or renamed under a
        # --new-under PATH, or NAME's turn in the rotation)

The nets run everything unless FUSED_AMP_CI_SELECT says: changed (CI: the changed files' share
and the rotation's third) or local (make ci-local: the changed files' share alone).
Any Python 3, no venv: .ci/run calls it before the venv exists.
"""
import os
import re
import subprocess
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = ".ci/submission"
ROTATION = 3  # any 3 consecutive submissions run every mutant and every sanitizer test
# What each group of sources is run by under the sanitizers, where a change there does not name
# its tests itself: the tests of the CUDA kernels on the emulator for the device code, the
# numerics tests for the CPU loops and op math, the bad-input tests for validation.
SANITIZED_BY = [
    ("csrc/cuda/", ("test_cuda_sim.py",)),
    ("tests/cuda_sim/", ("test_cuda_sim.py", "test_cuda_emulator.py")),
    ("csrc/cpu/", ("test_unscale.py", "test_optim.py", "test_clip.py", "test_memory_modes.py",
                   "test_quantized_state.py", "test_state4.py", "test_master24.py", "test_float8_weights.py",
                   "test_mx_weights.py")),
    ("csrc/ops/", ("test_unscale.py", "test_optim.py", "test_clip.py", "test_quantized_state.py", "test_state4.py",
                   "test_master24.py", "test_lion.py", "test_weight_amax.py", "test_delayed_scaling.py",
                   "test_float8_weights.py", "test_mx_weights.py")),
    ("csrc/core/", ("test_bad_input.py", "test_properties.py", "test_peer_checks.py")),
    ("csrc/py_lists", ("test_py_lists.py",)),
    ("csrc/register.cpp", ("test_bad_input.py",)),
    ("csrc/storage_kinds.h", ("test_memory_modes.py", "test_quantized_state.py", "test_state4.py", "test_master24.py")),
    ("csrc/optimizers.h", ("test_optim.py",)),
]


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def read_marker(text):
    """{last_ci_passed, counter} of a marker's text ({} for none)."""
    values = dict(re.findall(r"^(\w+)\s*=\s*(\S+)\s*$", text or "", re.M))
    return {"last_ci_passed": values.get("last_ci_passed"), "counter": int(values.get("counter", 0))}


def marker_at(commit):
    try:
        return read_marker(git("show", f"{commit}:{MARKER}"))
    except subprocess.CalledProcessError:  # before the marker existed: counter 0
        return read_marker("")


def marker():
    path = os.path.join(ROOT, MARKER)
    return read_marker(open(path).read() if os.path.exists(path) else "")


def problem():
    """Why the marker is not current, or None."""
    m = marker()
    if not m["last_ci_passed"]:
        return f"{MARKER} names no last_ci_passed commit"
    try:
        git("merge-base", "--is-ancestor", m["last_ci_passed"], "HEAD")
    except subprocess.CalledProcessError:
        return f"{MARKER}: last_ci_passed {m['last_ci_passed']} is not a commit before HEAD"
    want = marker_at(m["last_ci_passed"])["counter"] + 1
    if m["counter"] != want:
        return f"{MARKER}: counter is {m['counter']}, {want} for a submission after {m['last_ci_passed'][:10]}"
    return None


def checkout_start():
    """The commit this checkout started from (the oldest entry of HEAD's reflog): what had landed,
    so the last commit CI passed on, unless the last stop did not land."""
    return git("reflog", "--format=%H", "HEAD").split()[-1]


def mark(commit=None):
    """Writes the marker for a submission after commit (default: the checkout's start)."""
    commit = git("rev-parse", commit or checkout_start()).strip()
    counter = marker_at(commit)["counter"] + 1
    os.makedirs(os.path.join(ROOT, os.path.dirname(MARKER)), exist_ok=True)
    with open(os.path.join(ROOT, MARKER), "w") as f:
        f.write("# the last commit CI passed on, and this submission's number: tools/ci_select.py,\n"
                "# docs/development.md (CI's budget); `make ci-mark` once per submission\n"
                f"last_ci_passed = {commit}\ncounter = {counter}\n")
    return commit, counter


def everything():
    return os.environ.get("FUSED_AMP_CI_SELECT") not in ("changed", "local")


def rotating():
    return os.environ.get("FUSED_AMP_CI_SELECT") == "changed"


def changed():
    """The files changed since last_ci_passed: committed, staged, unstaged and untracked."""
    base = marker()["last_ci_passed"] or "HEAD"
    files = set(git("diff", "--name-only", base).split())
    files |= set(git("ls-files", "--others", "--exclude-standard").split())
    return files


def added_or_removed():
    """The files added, removed or renamed since last_ci_passed (both names of a rename), and the
    untracked ones."""
    base = marker()["last_ci_passed"] or "HEAD"
    files = set(git("diff", "--name-only", "--diff-filter=ADR", "--no-renames", base).split())
    files |= set(git("ls-files", "--others", "--exclude-standard").split())
    return files


def includes():
    """{path under csrc/: the csrc headers it includes, transitively}."""
    csrc = os.path.join(ROOT, "csrc")
    direct = {}
    for d, _, names in os.walk(csrc):
        for name in names:
            path = os.path.relpath(os.path.join(d, name), csrc)
            text = open(os.path.join(d, name), errors="replace").read()
            direct[path] = set(re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M))

    def closure(path, seen):
        for h in direct.get(path, ()):
            if h not in seen:
                seen.add(h)
                closure(h, seen)
        return seen
    return {path: closure(path, set()) for path in direct}


def bucket(key):
    """The rotation's share of a mutant or a test (stable while its key is)."""
    return zlib.crc32(key.encode()) % ROTATION


def in_rotation(key, counter):
    return bucket(key) == counter % ROTATION


class MutantSelection:
    """Which mutants a CI run runs: those of a changed file under csrc/ or of one that includes a
    changed header, those whose recorded killer (a test) changed, and the rotation's third."""

    def __init__(self, killers=None):
        self.all = everything()
        self.changed = changed()
        self.counter = marker()["counter"]
        self.killers = killers or {}
        graph = includes()
        changed_csrc = {f[len("csrc/"):] for f in self.changed if f.startswith("csrc/")}
        self.reached = {p for p, headers in graph.items() if p in changed_csrc or headers & changed_csrc}

    def why(self, file, key):
        """Why the mutant of csrc/<file> with the stable key runs, or None when it does not."""
        if self.all:
            return "all"
        if file in self.reached:
            return "file changed"
        test = self.killers.get(key)
        if test and test.split("::")[0] in self.changed:
            return "killer changed"
        if rotating() and in_rotation(key, self.counter):
            return "rotation"
        return None


def killers_recorded(net):
    """{mutant key: the test that killed it} of .ci/mutant-killers.txt (a tab-separated line
    each: net, key, test), written by the mutation tools' --record."""
    path = os.path.join(ROOT, ".ci", "mutant-killers.txt")
    found = {}
    if os.path.exists(path):
        for line in open(path):
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 3 and parts[0] == net:
                found[parts[1]] = parts[2]
    return found


def record_killers(net, killed):
    """Writes {key: test} of net into .ci/mutant-killers.txt, keeping the other net's lines."""
    path = os.path.join(ROOT, ".ci", "mutant-killers.txt")
    lines = [line for line in open(path)] if os.path.exists(path) else []
    lines = [line for line in lines if not line.startswith(net + "\t")]
    lines += [f"{net}\t{key}\t{test}\n" for key, test in sorted(killed.items()) if test]
    with open(path, "w") as f:
        f.writelines(sorted(lines))


def sanitize_selection(tests):
    """What the sanitizers run of their test files: (the files run whole, the share of the rest,
    or None for all of it). Whole: the changed ones and those of SANITIZED_BY's changed sources.
    Of the others, the tests in the rotation's third (tests/conftest.py, FUSED_AMP_TEST_SHARE: by test id, so that each third
    holds about a third of every file)."""
    files = changed()
    if everything():
        return list(tests), None
    reached = {t for prefix, names in SANITIZED_BY if any(f.startswith(prefix) for f in files) for t in names}
    whole = [t for t in tests if t in files or os.path.basename(t) in reached]
    # without the rotation, a share no test id falls in: the whole files alone
    return whole, f"{marker()['counter'] % ROTATION if rotating() else ROTATION}/{ROTATION}"


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    what, args = argv[0], argv[1:]
    if what == "check":
        why = problem()
        if why:
            print(f"{why}\nrun `make ci-mark` (tools/ci_select.py mark) and commit {MARKER}")
            return 1
        m = marker()
        print(f"submission {m['counter']}, after {m['last_ci_passed'][:10]}: rotation share "
              f"{m['counter'] % ROTATION} of {ROTATION}; {len(changed())} files changed")
        named, start = git("rev-parse", m["last_ci_passed"]).strip(), checkout_start()
        # (a checkout that lives on across sessions starts before the last landing, which
        # `make ci-mark COMMIT=...` names: a commit after the start)
        lived_on = named != start and subprocess.run(["git", "merge-base", "--is-ancestor", start, named],
                                                     cwd=ROOT).returncode == 0
        if "--local" in args and named != start and not lived_on:
            print(f"{MARKER} names {m['last_ci_passed'][:10]}, this checkout started from "
                  f"{start[:10]}: run `make ci-mark` unless the last stop did not land")
            return 1
        return 0
    if what == "mark":
        commit, counter = mark(args[0] if args else None)
        print(f"{MARKER}: submission {counter} after {commit[:10]}"
              + ("" if args else " (this checkout's start; if the last stop did not land, "
                                 "name the last landed commit: make ci-mark COMMIT=...)"))
        return 0
    if what == "due":
        name, paths = args[0], args[1:]
        paths, new_under = (paths[:paths.index("--new-under")], paths[paths.index("--new-under") + 1:]) \
            if "--new-under" in paths else (paths, [])
        hit = sorted(f for f in changed() if f.startswith(tuple(paths)))
        hit += sorted(f for f in added_or_removed() if new_under and f.startswith(tuple(new_under)))
        turn = rotating() and in_rotation(name, marker()["counter"])
        why = "all" if everything() else f"changed: {' '.join(hit[:5])}" if hit else "rotation" if turn else None
        print(f"{name}: {'runs (' + why + ')' if why else 'not due: none of its files changed, not its turn'}")
        return 0 if why else 1
    if what == "changed":
        print("\n".join(sorted(changed())))
        return 0
    if what == "sanitize-share":  # shell words for tools/sanitize.sh
        whole, share = sanitize_selection(args)
        print(f"FUSED_AMP_TEST_WHOLE='{' '.join(whole)}' FUSED_AMP_TEST_SHARE='{share or ''}'")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
