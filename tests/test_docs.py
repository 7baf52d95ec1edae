"""The documentation stays true: every Python example in README.md, docs/ and the public
docstrings runs, and every public class and function has a docstring that names each of its
arguments (the docs build, ``make docs``, checks their form with warnings as errors)."""
import inspect
import os
import re
import socket
from pathlib import Path

import pytest
import torch

import fused_amp
import torchtitan_cpu

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples():
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield pytest.param(match.group(1), id=f"{page.relative_to(ROOT)}:{line}")


EXAMPLES = list(examples())


class MyModel(torch.nn.Module):
    """What the examples call a user's model: layers (FSDP2 shards each), a forward."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def on_this_machine(code: str) -> str:
    """The examples are written for a GPU; without one they run on the CPU."""
    if torch.cuda.is_available():
        return code
    return code.replace('"cuda"', '"cpu"').replace(".cuda()", "")


@pytest.fixture(scope="module")
def process_group():
    """One gloo rank, for the distributed examples (DDP, ZeRO-1, FSDP2)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def test_the_pages_have_examples():
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize("code", EXAMPLES)
def test_every_python_example_runs(code, process_group):
    torch.manual_seed(0)
    if "torchtitan" in code:  # docs/torchtitan.md: torchtitan's own folder (tests/torchtitan_cpu.py)
        torchtitan_cpu.on_path()
    namespace = dict(torch=torch, fused_amp=fused_amp, MyModel=MyModel,
                     model=MyModel().bfloat16(), loss_fn=torch.nn.functional.mse_loss,
                     loader=[(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(3)])
    exec(compile(on_this_machine(code), "<example>", "exec"), namespace)


def docstring_examples():
    """The literal blocks (``::``) of the public docstrings: code, to run as the pages' is."""
    for name, obj in public_callables():
        lines = (inspect.getdoc(obj) or "").split("\n")
        for i, line in enumerate(lines):
            if not line.endswith("::") or line.lstrip().startswith(".."):
                continue
            block = []
            for following in lines[i + 1:]:
                if following.strip() and not following.startswith("    "):
                    break
                block.append(following[4:])
            yield pytest.param("\n".join(block).strip() + "\n", id=f"{name}:{i + 1}")


def public_callables():
    names = [(f"fused_amp.{n}", getattr(fused_amp, n)) for n in fused_amp.__all__]
    names += [(f"fused_amp.optim.{n}", getattr(fused_amp.optim, n)) for n in fused_amp.optim.__all__]
    names += [(f"fused_amp.ops.{n}", getattr(fused_amp.ops, n)) for n in
              ("unscale_", "non_finite_check_", "grad_norm_", "update_scale_", "step_",
               "optimizers")]
    names += [("fused_amp.integrations.install_grad_scaler", fused_amp.integrations.install_grad_scaler)]
    return [(n, obj) for n, obj in names if callable(obj) and not inspect.ismodule(obj)]


@pytest.mark.parametrize("name,obj", public_callables(), ids=[n for n, _ in public_callables()])
def test_every_public_callable_documents_each_argument(name, obj):
    doc = inspect.getdoc(obj) or ""
    assert len(doc) > 40, f"{name} has no docstring"
    target = obj.__init__ if inspect.isclass(obj) else obj
    if inspect.isclass(obj) and target is object.__init__:
        return  # a dataclass of fields: its docstring names them
    params = [p for p in inspect.signature(target).parameters.values()
              if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    missing = [p.name for p in params if not re.search(rf"\b{re.escape(p.name)}\b", doc)]
    assert not missing, f"{name}: its docstring does not name {missing}"


DOCSTRING_EXAMPLES = list(docstring_examples())


@pytest.mark.parametrize("code", DOCSTRING_EXAMPLES)
def test_every_docstring_example_runs(code):
    """Against a bf16 model stepped once by our Adam (``model``, ``opt``) and an fp32 checkpoint
    of the same model under torch's Adam (``ckpt``), the names the examples use."""
    torch.manual_seed(0)
    model32 = MyModel()
    torch_opt = torch.optim.Adam(model32.parameters(), lr=1e-3)
    model = MyModel().bfloat16()
    opt = fused_amp.optim.Adam(model.parameters(), lr=1e-3)
    for net, optimizer in ((model32, torch_opt), (model, opt)):
        net(torch.ones(2, 8, dtype=next(net.parameters()).dtype)).float().sum().backward()
        optimizer.step()
    ckpt = {"model": model32.state_dict(), "optimizer": torch_opt.state_dict()}
    namespace = dict(torch=torch, fused_amp=fused_amp, model=model, opt=opt, ckpt=ckpt)
    exec(compile(code, "<docstring example>", "exec"), namespace)


def test_the_docstrings_have_examples():
    assert len(DOCSTRING_EXAMPLES) >= 3


def test_make_docs_builds_the_pages_this_test_reads():
    """docs/index.md lists every page of docs/ (a page not in a toctree is a build warning)."""
    index = (ROOT / "docs" / "index.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs").glob("*.rst")):
        if page.name != "index.md":
            assert re.search(rf"^{re.escape(page.stem)}$", index, re.M), page.name
    assert os.path.exists(ROOT / "docs" / "conf.py")


def paragraphs(text: str):
    """The prose paragraphs of a Markdown page (no code, tables, headings or directives), each
    with its first line number; a list item counts as a paragraph of its own."""
    para, start, fence = [], 0, False
    for n, line in enumerate(text.splitlines() + [""], 1):
        if line.startswith("```"):
            fence = not fence
        starts_item = re.match(r"^\s*([-*]|\d+\.) ", line)
        if fence or not line.strip() or line.startswith(("#", "|", "```", ":")) or starts_item:
            if para:
                yield start, " ".join(para)
            para = []
            if starts_item and not fence:
                para, start = [line], n
            continue
        if not para:
            start = n
        para.append(line)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_paragraphs_are_short_and_code_fits_the_column(page):
    """A reader's page: no paragraph over 120 words, no line of code over black's 88 characters
    (README and docs/; tests/test_docs_browser.py renders the pages and checks their widths)."""
    text = page.read_text()
    long = [f"line {n}: {len(p.split())} words" for n, p in paragraphs(text) if len(p.split()) > 120]
    assert not long, long
    wide, fence = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        elif fence and len(line) > 88:
            wide.append(f"line {n}: {len(line)} characters")
    assert not wide, wide
