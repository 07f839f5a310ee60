"""The example notebook runs top to bottom on the zoo model (nbclient), as a reader would run it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel gets Jupyter's inline backend, as a reader's does
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # a reader's own figures after headscope's (#32 item 2): Result.plot() draws inline, returns Figures
    # and leaves the kernel's backend alone, so the user's plt figure after it renders too
    nb.cells += [nbformat.v4.new_code_cell(c) for c in (
        "import matplotlib, matplotlib.pyplot as plt\nfrom matplotlib.figure import Figure\n"
        "figures = imp.plot()\nassert figures and all(isinstance(f, Figure) for f in figures.values())",
        "plt.plot([0, 1], [1, 0])\nplt.show()",
        "print(matplotlib.get_backend())",
    )]
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("<img" in h for h in html), "the importance Result should render with its figure"
    # the one-prompt calls (#32 item 7): a short patching view with its grids, every token of the
    # prompt on show_tokens' lines, and the chosen heads' patterns
    one = next(h for h in html if "effect (resid_pre)" in h)
    assert "<img" not in one and len(one) < 20_000
    tokens = next(h for h in html if "headscope-tokens" in h)
    rows = tokens.count("<tr>")  # one table row per method (review 18e C2: every method, tokens aligned in columns)
    assert rows >= 6 and tokens.count(">k44</td>") == 2 * rows and ">;</td>" in tokens  # k44 twice on each row
    assert sum("<b>L1H0</b>" in h and "<b>L1H1</b>" in h for h in html) == 1
    assert any("report.html" in str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    plotted, own, backend = (cell.get("outputs", []) for cell in nb.cells[-3:])
    assert plotted and all("image/png" in o.get("data", {}) for o in plotted)  # one image per figure
    assert len(own) == 1 and "image/png" in own[0].get("data", {})
    assert "".join(o.get("text", "") for o in backend).strip() == "module://matplotlib_inline.backend_inline"


def _daily_tasks(monkeypatch):
    """examples/tl_daily_tasks.py as a module (examples/ is not a package)."""
    import importlib.util

    path = NOTEBOOK.parent / "tl_daily_tasks.py"
    spec = importlib.util.spec_from_file_location("tl_daily_tasks", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_tl_daily_tasks_take_no_more_lines_than_transformer_lens(monkeypatch):
    """Issue #32's yardstick: each of a TransformerLens user's ten daily tasks, run both ways on the zoo's
    synth-gpt2 (the script asserts that both sides compute the same numbers), takes no more lines in
    headscope than in TransformerLens 4.3's TransformerBridge; the README shows the same table."""
    daily = _daily_tasks(monkeypatch)

    def sample(model):
        """A docstring, not counted."""
        x = model(1)  # a comment after code: counted
        # a comment line: not counted

        y = (x,
             x)
        return x, y

    assert daily.count_lines(sample) == 3  # x = ..., and the two lines of y; `return x, y` hands values on
    rows = daily.run()
    assert [r.task for r in rows] == list(daily.TASKS.values())
    for r in rows:
        assert 0 < r.headscope <= r.transformer_lens, r
    readme = (NOTEBOOK.parents[1] / "README.md").read_text()
    assert daily.table(rows) in readme, "README's table of daily tasks is out of date: paste the script's output"


def test_readme_quick_start_comments_hold_on_an_encoder_and_a_decoder(arch_models, arch_dirs, mixed_tasks):
    """Review 15c C4: the quick start's comments said every mask is left-padded and `logits[i, -1]` is row i's answer,
    which holds on a decoder only. On BERT the task is right-padded (row i: its plain Hugging Face tokenization, then
    padding), `model(...)` gives final hidden states [batch, pos, d_model], and attention_mask[i].sum() - 1 is row i's
    last real token ([SEP]); on GPT-2 the mask is left-padded and the output [batch, pos, vocab]. The README says both."""
    import json

    import torch
    from transformers import AutoTokenizer

    import headscope as hs
    from tests_support import mixed_length_rows

    readme = (NOTEBOOK.parents[1] / "README.md").read_text()
    assert "decoders left-padded, encoders right" in readme
    assert "an encoder gives final hidden states [batch, pos, d_model]" in readme
    assert "row i ends at task.attention_mask[i].sum() - 1" in readme
    bert = arch_models("bert")
    rows = mixed_length_rows(bert, 6, corrupt=False)
    task = hs.load_task(bert, rows, {"prompt": "text", "answer": "label"})
    plain = AutoTokenizer.from_pretrained(arch_dirs["bert"])
    d_model = json.loads((arch_dirs["bert"] / "config.json").read_text())["hidden_size"]
    with torch.no_grad():
        out = bert(task.tokens, attention_mask=task.attention_mask)
    assert out.shape == (*task.tokens.shape, d_model)
    lengths = {len(plain(r["text"])["input_ids"]) for r in rows}
    assert len(lengths) > 1  # rows of several lengths: padding shows
    for i, row in enumerate(rows):
        ids = plain(row["text"])["input_ids"]
        n = int(task.attention_mask[i].sum())
        assert n == len(ids) and task.attention_mask[i].tolist() == [1] * n + [0] * (task.tokens.shape[1] - n)
        assert task.tokens[i, :n].tolist() == ids and ids[n - 1] == plain.sep_token_id
    gpt2, decoder_task = arch_models("gpt2"), mixed_tasks("gpt2")
    mask = decoder_task.attention_mask
    assert all(mask[i].tolist() == sorted(mask[i].tolist()) for i in range(len(mask))) and not mask[:, -1].eq(0).any()
    with torch.no_grad():
        logits = gpt2(decoder_task.tokens, attention_mask=mask)
    assert logits.shape == (*decoder_task.tokens.shape, gpt2.facts.d_vocab)
