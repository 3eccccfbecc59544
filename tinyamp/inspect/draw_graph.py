"""The computation graph of a loss, drawn: one box per op and per leaf tensor, coloured by dtype.

``draw_graph(loss)`` walks the graph as the backward pass does (``autograd.walk``, then
each node's ``inputs``) and draws it in rows: the loss at the bottom, each box as far
above it as its longest path to the loss.  Every box shows the shape and dtype of the tensor
it makes (an op's output, or the leaf itself); every arrow is one input of one op, in the
colour of the dtype it carries.  So the picture shows where FP16 meets FP32: the Cast
boxes are the casts, those autocast inserted marked "(autocast)".

``to_dot(loss)`` writes the same graph in Graphviz's DOT language, for ``dot -Tsvg``.
Draw before ``backward()``: it frees the graph as it goes (unless ``retain_graph=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tinyamp import autograd
from tinyamp.autocast import AUTOCAST_COPY
from tinyamp.casting import Cast
from tinyamp.tensor import Tensor

# (fill, line) per dtype: the same colours in every tinyamp picture of a step or a graph
DTYPE_COLORS = {
    "float16": ("#fbd0cf", "#d62728"),
    "bfloat16": ("#e3d7f0", "#9467bd"),
    "float32": ("#cfe3f3", "#1f77b4"),
    "float64": ("#dddddd", "#555555"),
}
OTHER_COLORS = ("#ffffff", "#999999")  # integer and bool tensors (labels, masks): no gradient
NODE_W, NODE_H, GAP_X, GAP_Y = 1.55, 0.62, 0.3, 0.38  # inches on the drawing
MIN_WIDTH = 6.5  # inches: room for the title and the legend


def dtype_colors(dtype: str) -> tuple[str, str]:
    """(fill, line) colour for a dtype name: FP16 red, BF16 purple, FP32 blue, FP64 grey, others white."""
    return DTYPE_COLORS.get(dtype, OTHER_COLORS)


@dataclass(frozen=True)
class GraphNode:
    """An op (kind "op") or a leaf tensor (kind "leaf"); a Cast op, or autocast's copy of a leaf, is a cast."""

    id: str
    kind: str
    title: str  # the op's name, or the leaf's name
    shape: tuple[int, ...]  # of the op's output, or of the leaf
    dtype: str
    depth: int  # the longest path to the loss, in ops (the loss's own op: 0)
    cast: bool = False  # a Cast op, or a leaf that autocast cast (it needs no gradient, so no Cast op was kept)
    autocast: bool = False  # a cast autocast inserted
    source_dtype: str | None = None  # a Cast op's input dtype


@dataclass(frozen=True)
class GraphEdge:
    """One input of an op: the tensor from `source` (its shape and dtype) read by `target`."""

    source: str
    target: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Graph:
    """The nodes (ops first, the loss's op first of all, then the leaves) and edges of a loss's graph."""

    nodes: list[GraphNode] = field(default_factory=list)
    edges: list[GraphEdge] = field(default_factory=list)


def loss_graph(loss: Tensor, model: Any = None) -> Graph:
    """The graph of `loss`, walked as backward walks it; `model` (optional) names the parameters."""
    names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
    fns = list(autograd.walk(loss))  # outputs first: every consumer of a node comes before it
    if any(fn.saved is None for fn in fns):
        raise ValueError(
            "backward() has already freed this graph (each node lets go of its inputs as the walk passes it): "
            "draw the graph before backward, or call backward(retain_graph=True)"
        )
    op_ids = {id(fn): f"op{i}" for i, fn in enumerate(fns)}
    leaves: dict[int, tuple[str, Tensor]] = {}
    depth = {"op0": 0} if fns else {}
    output = {"op0": (tuple(loss.shape), loss.dtype.name)} if fns else {}
    autocast_copies: set[str] = set()
    graph = Graph()
    for fn in fns:
        here = op_ids[id(fn)]
        for t in fn.inputs:
            if t.is_leaf:
                there = leaves.setdefault(id(t), (f"leaf{len(leaves)}", t))[0]
            else:
                there = op_ids[id(t.creator)]
                output[there] = (tuple(t.shape), t.dtype.name)
                if t.name == AUTOCAST_COPY:
                    autocast_copies.add(there)
            depth[there] = max(depth.get(there, 0), depth[here] + 1)  # final: all of `here`'s consumers came first
            graph.edges.append(GraphEdge(there, here, tuple(t.shape), t.dtype.name))
    reads = {e.target: e.dtype for e in graph.edges}
    for fn in fns:
        node = op_ids[id(fn)]
        is_cast = isinstance(fn, Cast)
        graph.nodes.append(GraphNode(node, "op", fn.name, *output[node], depth[node], is_cast,
                                     node in autocast_copies, reads.get(node) if is_cast else None))  # fmt: skip
    if not fns:  # the loss is a leaf: a graph of one node
        leaves[id(loss)], depth["leaf0"] = ("leaf0", loss), 0
    for node, t in leaves.values():
        copy = t.name == AUTOCAST_COPY
        title = t.name or names.get(id(t), "leaf (requires grad)" if t.requires_grad else "tensor (no grad)")
        graph.nodes.append(GraphNode(node, "leaf", title, tuple(t.shape), t.dtype.name, depth[node], copy, copy))
    return graph


def _label(node: GraphNode) -> str:
    """Three lines: what the node is, the shape, the dtype (a Cast: from -> to)."""
    title, dtype = node.title, node.dtype
    if node.kind == "op" and node.cast:
        title += " (autocast)" if node.autocast else ""
        dtype = f"{node.source_dtype} -> {node.dtype}"
    return f"{title}\n{node.shape}\n{dtype}"


def to_dot(loss: Tensor, model: Any = None) -> str:
    """The graph of `loss` in Graphviz DOT: one statement per node, one line per edge (``dot -Tsvg``)."""
    graph = loss_graph(loss, model)
    lines = ["digraph loss {", "  rankdir=TB;", '  node [style="filled", fontname="Helvetica", fontsize=10];']
    for n in graph.nodes:
        fill, line = dtype_colors(n.dtype)
        label = _label(n).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        shape = "ellipse" if n.kind == "leaf" else "box"
        bold = ", penwidth=2.5" if n.cast else ""
        lines.append(f'  {n.id} [label="{label}", shape={shape}, fillcolor="{fill}", color="{line}"{bold}];')
    for e in graph.edges:
        lines.append(f'  {e.source} -> {e.target} [label="{e.shape} {e.dtype}", color="{dtype_colors(e.dtype)[1]}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_graph(loss: Tensor, model: Any = None, title: str | None = None) -> Any:
    """The graph that produced `loss`, as a matplotlib Figure (draw it before ``backward()``).

    One box per op (its name, output shape and dtype) and per leaf tensor (its name when
    `model` gives one, shape and dtype), filled in its dtype's colour; casts have a thick
    border, and "(autocast)" when autocast inserted them.  One arrow per input of an op, in
    the colour of the dtype it carries.  Rows are the longest path to the loss (at the bottom).
    Artists carry gids: "node:ID" on a box and its text, "edge:SOURCE->TARGET" on an arrow.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

    graph = loss_graph(loss, model)
    corner, width, height = _layout(graph)
    top = 0.8  # inches above the boxes, for the title and the legend
    fig = Figure(figsize=(width, height + top), dpi=100)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height + top)
    ax.set_axis_off()
    for n in graph.nodes:
        x, y = corner[n.id]
        fill, line = dtype_colors(n.dtype)
        style = "round,pad=0,rounding_size=0.25" if n.kind == "leaf" else "square,pad=0"
        ax.add_patch(FancyBboxPatch((x, y), NODE_W, NODE_H, boxstyle=style, facecolor=fill, edgecolor=line,
                                    lw=2.2 if n.cast else 0.9, gid=f"node:{n.id}"))  # fmt: skip
        ax.text(x + NODE_W / 2, y + NODE_H / 2, _label(n), ha="center", va="center", fontsize=6.5,
                linespacing=1.15, gid=f"node:{n.id}")  # fmt: skip
    seen: dict[tuple[str, str], int] = {}
    for e in graph.edges:
        (xs, ys), (xt, yt) = corner[e.source], corner[e.target]
        repeat = seen[(e.source, e.target)] = seen.get((e.source, e.target), -1) + 1  # x * x: two arrows
        # an arrow that skips rows (a residual connection) bows sideways, around the boxes between
        bend = 0.8 * repeat + (0.12 if ys - yt > NODE_H + GAP_Y + 1e-9 else 0.0)
        arrow = FancyArrowPatch((xs + NODE_W / 2, ys), (xt + NODE_W / 2, yt + NODE_H), arrowstyle="-|>",
                                connectionstyle=f"arc3,rad={bend}", mutation_scale=8, lw=0.9, zorder=0.5,
                                color=dtype_colors(e.dtype)[1], gid=f"edge:{e.source}->{e.target}")  # fmt: skip
        ax.add_patch(arrow)
    shown = list(dict.fromkeys(n.dtype for n in graph.nodes))
    handles = [Patch(facecolor=dtype_colors(d)[0], edgecolor=dtype_colors(d)[1], label=d) for d in shown]
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=7, frameon=False)
    casts = [n for n in graph.nodes if n.cast]
    ops, leaves = sum(n.kind == "op" for n in graph.nodes), sum(n.kind == "leaf" for n in graph.nodes)
    about = f"{_count(ops, 'op')}, {_count(leaves, 'leaf tensor')}, {_count(len(graph.edges), 'edge')};\n"
    if casts:
        about += f"{_count(len(casts), 'cast')} (thick borders), {sum(n.autocast for n in casts)} inserted by autocast"
    else:
        about += "no casts"
    ax.text(0.15, height + top - 0.1, title or "The graph of the loss", ha="left", va="top", fontsize=9)
    ax.text(0.15, height + top - 0.33, about, ha="left", va="top", fontsize=7, color="#444444")
    return fig


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _layout(graph: Graph) -> tuple[dict[str, tuple[float, float]], float, float]:
    """Lower-left corner of each box (rows by depth, the loss at the bottom), and the drawing's width and height."""
    layers = 1 + max(n.depth for n in graph.nodes)
    readers: dict[str, list[str]] = {}
    for e in graph.edges:
        readers.setdefault(e.source, []).append(e.target)
    columns = max(sum(n.depth == d for n in graph.nodes) for d in range(layers))
    width = max(columns * (NODE_W + GAP_X) + 0.3, MIN_WIDTH)
    place: dict[str, float] = {}  # the column of each box, from the left
    for d in range(layers):  # from the loss up: the readers of a box are placed before it
        row = [n.id for n in graph.nodes if n.depth == d]
        # each box near the mean column of the boxes that read it: fewer crossing arrows
        row.sort(key=lambda i: sum(place[r] for r in readers.get(i, [])) / max(len(readers.get(i, [])), 1))
        first = (columns - len(row)) / 2  # centred
        place.update({i: first + k for k, i in enumerate(row)})
    left = (width - columns * (NODE_W + GAP_X) + GAP_X) / 2
    corner = {n.id: (left + place[n.id] * (NODE_W + GAP_X), 0.15 + n.depth * (NODE_H + GAP_Y)) for n in graph.nodes}
    return corner, width, 0.15 + layers * (NODE_H + GAP_Y)
