"""The attention explorer's prompt box in notebooks: `hs.show_attention(model, prompt)` in a live kernel.

In a Jupyter kernel (JupyterLab, classic Notebook, VS Code, Colab) the explorer displays as an
ipywidgets box: a Text field above an Output that holds the explorer's HTML. Typing a prompt and
pressing Enter runs the model on it in the kernel and puts a new explorer, built on that prompt's
tokens, in the Output (the Output renders HTML as the notebook does, so the explorer's script runs;
nothing is fetched). The display also carries the explorer's HTML as text/html, so a frontend
without widget support, or a saved notebook, still shows the explorer on the first prompt.

Outside a kernel, or when show_attention was given prompt_box=False, the explorer displays as plain
HTML. Without ipywidgets (the optional extra `headscope[notebook]`) a kernel shows the plain
explorer under one sentence saying how to get the box.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from headscope.errors import HeadscopeError
from headscope.reports.render import escape

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"  # how a kernel displays a widget (ipywidgets 7 and 8)
NO_WIDGETS = ("<p class='hsx-nobox' style='color:#555'>To type your own prompt into this explorer, install "
              "ipywidgets (<code>pip install \"headscope[notebook]\"</code>) and run the cell again.</p>")


def live_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (IPython's shell has a kernel: ipykernel, VS Code, Colab);
    IPython is not imported when it is not loaded already."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return getattr(shell, "kernel", None) is not None


def ipywidgets() -> Any:
    """The ipywidgets module, None when it is not installed."""
    try:
        import ipywidgets as widgets
    except ImportError:
        return None
    return widgets


class PromptBox:
    """A prompt field over the explorer: `submit(prompt)` (what Enter does) re-renders the explorer on it.

    build(prompt) -> an explorer (`.html()`, repr) on that prompt; `explorer` is the one shown, `output`
    the ipywidgets Output holding its HTML, `text` the Text field, `status` a line for errors."""

    def __init__(self, build: Callable[[str], Any], first: Any) -> None:
        widgets = ipywidgets()
        if widgets is None:
            raise ImportError("the prompt box needs ipywidgets: pip install \"headscope[notebook]\"")
        self._build = build
        self.text = widgets.Text(placeholder="type a prompt and press Enter", description="prompt:",
                                 continuous_update=False, layout=widgets.Layout(width="min(100%, 60em)"))
        self.status = widgets.HTML()
        self.output = widgets.Output()
        self.box = widgets.VBox([self.text, self.status, self.output])
        self._show(first)
        self.text.observe(lambda change: self.submit(change["new"]), names="value")  # on Enter (or leaving the field)

    def _show(self, explorer: Any) -> None:
        self.explorer = explorer
        self.output.outputs = ({"output_type": "display_data", "metadata": {},
                                "data": {"text/html": explorer.html(), "text/plain": repr(explorer)}},)

    def submit(self, prompt: str) -> None:
        """Run the model on `prompt` and show the explorer on it; a bad prompt leaves the last one shown
        and says why in the status line."""
        if not prompt.strip():
            self.status.value = "Type a prompt, then press Enter."
            return
        self.status.value = "<i>running the model on the prompt\u2026</i>"
        try:
            explorer = self._build(prompt)
        except HeadscopeError as err:
            self.status.value = f"<span style='color:#b2182b'>{escape(str(err))}</span>"
            return
        except Exception as err:  # noqa: BLE001 - an unexpected failure (out of memory, ...) is said, not lost in the widget log
            self.status.value = f"<span style='color:#b2182b'>{escape(type(err).__name__ + ': ' + str(err))}</span>"
            return
        self._show(explorer)
        self.status.value = ""

    def mimebundle(self) -> dict[str, Any]:
        """The box's display: the widget view, with the explorer's HTML and text for frontends without widgets."""
        handle = getattr(self.box, "_handle_displayed", None)
        if handle is not None:
            handle()
        return {WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.box.model_id},
                "text/html": self.explorer.html(), "text/plain": repr(self.explorer)}


def notebook_bundle(explorer: Any, build: Callable[[str], Any] | None) -> dict[str, Any]:
    """What a notebook displays for `explorer`: in a live kernel with a prompt builder, a PromptBox (or,
    without ipywidgets, the HTML under NO_WIDGETS); else the explorer's HTML."""
    html = {"text/html": explorer.html(), "text/plain": repr(explorer)}
    if build is None or not live_kernel():
        return html
    if ipywidgets() is None:
        return {**html, "text/html": NO_WIDGETS + html["text/html"]}
    return PromptBox(build, explorer).mimebundle()


__all__ = ["NO_WIDGETS", "PromptBox", "WIDGET_MIME", "ipywidgets", "live_kernel", "notebook_bundle"]
