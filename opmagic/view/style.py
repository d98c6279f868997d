"""The look shared by every opmagic view: one stylesheet and the colours of kernel kinds."""

from __future__ import annotations

# Every HTML view wraps itself in <div class="opmagic"> after this stylesheet.
# The doubled class outranks JupyterLab's `:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td`
# (cells aligned right); the line-height undoes the one-line height ipywidgets gives the lines
# of an HTML widget (the explorer's tabs).
STYLESHEET = (
    "<style>div.opmagic{line-height:1.4}div.opmagic.opmagic td,div.opmagic.opmagic th"
    "{padding:1px 8px;text-align:left;vertical-align:top;font-family:monospace;font-size:12px}"
    "div.opmagic.opmagic th{white-space:nowrap}div.opmagic .dim{color:#888}"
    "div.opmagic.opmagic pre{text-align:left;margin:2px 0;font-size:12px;line-height:1.35}"
    ".opmagic .call,.opmagic .group,.opmagic .module{font-family:monospace;font-size:12px;"
    "white-space:nowrap}"
    ".opmagic .calls{margin-left:6px;padding-left:6px;border-left:1px solid #ddd}"
    ".opmagic .op{font-weight:bold}.opmagic .time{color:#555}"
    # a tree row: what it is, cut with an ellipsis at the pane's edge, then its time, in view
    ".opmagic .row{display:flex;gap:8px;align-items:baseline}"
    ".opmagic .row .main{flex:1 1 auto;min-width:0;overflow:hidden;text-overflow:ellipsis}"
    ".opmagic .row .time{flex:none}"
    ".opmagic summary.row{list-style:none;cursor:pointer}"
    ".opmagic summary.row::-webkit-details-marker{display:none}"
    '.opmagic summary.row::before{content:"▸";flex:none;color:#888}'
    '.opmagic details[open]>summary.row::before{content:"▾"}'
    ".opmagic .leaf>.row{padding-left:14px}.opmagic .group>.row .op{color:#6a1b9a}"
    ".opmagic .under{white-space:normal;padding-left:22px;color:#555}"
    ".opmagic .once{color:#ef6c00}"
    ".opmagic details.section>summary{font-weight:bold;margin-top:4px}"
    ".opmagic table.wraps td,.opmagic table.wraps th{white-space:normal}"
    ".opmagic table.wraps td:last-child{overflow-wrap:anywhere}"
    ".opmagic .headline{white-space:normal;font-weight:bold}"  # a summary wraps where it is shown
    # the tree takes the width it is given, not its rows'
    ".opmagic .calls-pane{overflow-x:auto;contain:inline-size}</style>"
)

# text colour per kernel kind (TableEntry.kind), in HTML, diagrams and DataFrames
KIND_COLOURS = {
    "kernel": "#2e7d32",
    "alias": "#1565c0",
    "autograd": "#6a1b9a",
    "fallback": "#ef6c00",
    "fallthrough": "#9e9e9e",
    "stub": "#c62828",
    "ambiguous": "#c62828",
    "missing": "#c62828",
}
# fill colour per kernel kind, for diagram nodes and DataFrame cells
KIND_FILLS = {
    "kernel": "#e8f5e9",
    "alias": "#e3f2fd",
    "autograd": "#f3e5f5",
    "fallback": "#fff3e0",
    "fallthrough": "#f5f5f5",
    "stub": "#fff8e1",
    "ambiguous": "#ffebee",
    "missing": "#ffebee",
}
# check and comparison results
STATUS_COLOURS = {"pass": "#2e7d32", "FAIL": "#c62828", "error": "#c62828", "skip": "#9e9e9e"}
FAIL_FILL = "#ffebee"  # the background of failing rows
PATH_COLOUR = "#0d47a1"  # the call's path in diagrams
FAIL_COLOUR = "#c62828"  # where dispatch fails
DIM_COLOUR = "#9e9e9e"  # keys passed over


def styled(body: str) -> str:
    """``body`` as one opmagic HTML view: the stylesheet, then the body in its wrapper."""
    return f'{STYLESHEET}<div class="opmagic">{body}</div>'
