"""The Rewriter: graph mutations that keep def-use lists right and feed the worklist.

Every change a simplification makes goes through here, so the engine knows
exactly which nodes to look at again: replacing a value enqueues its users,
removing a node enqueues the producers of its inputs (they may now be dead),
adding a node enqueues it.  Nodes are kept in a heap ordered by their position
in the graph, so producers are (re)visited before their users and each change
costs work proportional to what it touches, not to the graph's size.

Only a node whose inputs changed is enqueued *stale* (its types re-inferred at
its visit).  A producer whose output lost its last reader may now be dead, but
its types cannot have changed, nor can anything else a visit would try (folding,
parameters, rules, merging all look at its inputs).  So when a node is removed,
or an input of a node replaced, a producer left with no output read is removed
at once, and so on up the chain (:meth:`_reader_gone`): on a BERT-like encoder,
where each static Reshape lets a Concat, its Unsqueezes, Gathers and Shape go
one after another, going through the worklist for each was a third of the
visits.  A producer with other outputs still read is queued for a visit instead
(:meth:`enqueue_for_liveness`): a rule may wait for one output to go unread.

Removal is lazy: a removed node is detached at once (def-use lists updated)
and dropped from its graph's node list in one sweep by :meth:`compact`.  So is
placement: a node added before another is appended to the list at once and
moved to its place by the same sweep, since finding the anchor in the list on
every addition made a 48-layer encoder's simplify quadratic in its size.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from ...ir.graph import Graph, Node, Value


class Rewriter:
    def __init__(self, root: Graph, nodes: Optional[list[Node]] = None):
        """``nodes``: every node of the tree in ``walk_nodes`` order, if the caller has
        them already (saves a walk)."""
        self.root = root
        self._heap: list[tuple[float, int, Node]] = []
        # Nodes queued all at once at the start, in graph order: visited straight from
        # this list (merged with the heap by position) rather than pushed and popped.
        self._pending: list[tuple[float, Node]] = []
        self._next_pending = 0
        self._queued: set[int] = set()
        self._stale: set[int] = set()
        # Queued nodes that need every step of a visit, not just the dead check.
        self._full: set[int] = set()
        self._order: dict[int, float] = {}
        self._tiebreak = itertools.count()
        self._dirty_graphs: set[int] = set()
        # id(graph) -> id(anchor) -> the nodes added to go just before the anchor, in
        # the order they were added (compact_graph puts them there).
        self._placements: dict[int, dict[int, list[Node]]] = {}
        self._removed: list[Node] = []
        self.changes = 0
        #: Nodes removed because nothing read them any more (see _reader_gone).
        self.removed_dead = 0
        if nodes is None:
            nodes = list(root.walk_nodes())
        # id(body) -> the node that owns it; the engine records the owners of bodies it moves.
        self.owners: dict[int, Node] = {}
        graphs = [root]
        for node in nodes:
            if node.has_subgraphs():
                for sub in node.subgraphs():
                    self.owners[id(sub)] = node
                    graphs.append(sub)
        # Values some graph of the tree returns (a use that no ``users`` list records):
        # id(value) -> the graphs that do.  It may also list a graph that stopped
        # returning it, or went away with its node: asking (_still_returned) filters.
        self._returned_by: dict[int, list[Graph]] = {}
        for graph in graphs:
            for value in graph.outputs:
                _add_graph(self._returned_by.setdefault(id(value), []), graph)
        self.renumber(nodes)

    # -- ordering and the worklist -----------------------------------------------
    def renumber(self, nodes: Optional[list[Node]] = None) -> None:
        """Give every node a position: its index in a pre-order walk of the tree
        (``nodes``: that walk, if the caller has it)."""
        walk = self.root.walk_nodes() if nodes is None else nodes
        self._order = {id(node): float(position) for position, node in enumerate(walk)}

    def order(self, node: Node) -> float:
        return self._order.get(id(node), 0.0)

    def _admit(self, node: Optional[Node], stale: bool, full: bool = True) -> bool:
        """Mark ``node`` stale and in need of a full visit if asked; True if it is live
        and was not queued yet (and now counts as queued)."""
        if node is None or node.graph is None:
            return False
        key = id(node)
        if stale:
            self._stale.add(key)
        if full:
            self._full.add(key)
        if key in self._queued:
            return False
        self._queued.add(key)
        return True

    def enqueue(self, node: Optional[Node], stale: bool = True) -> None:
        """Queue ``node`` for a visit; ``stale`` means its types must be re-inferred."""
        if self._admit(node, stale):
            heapq.heappush(self._heap, (self._order.get(id(node), 0.0), next(self._tiebreak), node))

    def enqueue_all(self, nodes: Iterable[Node], stale: bool = True) -> None:
        """enqueue() for each node.  Into an empty worklist (the whole graph, at the
        start) they go into a list sorted by position, which ``pop`` merges with the
        heap: the visits come in the same order as if each had been pushed."""
        if self._heap or self._next_pending < len(self._pending):
            for node in nodes:
                self.enqueue(node, stale)
            return
        order = self._order
        self._pending = sorted(((order.get(id(n), 0.0), n) for n in nodes if self._admit(n, stale)),
                               key=lambda entry: entry[0])
        self._next_pending = 0

    def enqueue_for_liveness(self, node: Optional[Node]) -> None:
        """Queue ``node`` to check whether it is dead: one of its readers went away."""
        if self._admit(node, stale=False, full=False):
            heapq.heappush(self._heap, (self._order.get(id(node), 0.0), next(self._tiebreak), node))

    def take_full(self, node: Node) -> bool:
        """Whether ``node`` was queued for more than the dead check (and clear it)."""
        if id(node) in self._full:
            self._full.discard(id(node))
            return True
        return False

    def take_stale(self, node: Node) -> bool:
        """Whether something changed around ``node`` since its types were inferred (and clear it)."""
        if id(node) in self._stale:
            self._stale.discard(id(node))
            return True
        return False

    def enqueue_users(self, value: Value, stale: bool = True) -> None:
        for user, _ in value.users:
            self.enqueue(user, stale)
            # A user inside a subgraph also affects the node that owns the subgraph.
            self.enqueue(self._owner_in(user, value.graph), stale)

    def pop(self) -> Optional[Node]:
        """The queued node first in graph order (None when none is left)."""
        heap, pending = self._heap, self._pending
        while True:
            if self._next_pending < len(pending) and (not heap or pending[self._next_pending][0] <= heap[0][0]):
                node = pending[self._next_pending][1]
                self._next_pending += 1
            elif heap:
                node = heapq.heappop(heap)[2]
            else:
                return None
            self._queued.discard(id(node))
            if node.graph is not None:
                return node

    def __bool__(self) -> bool:
        return bool(self._heap) or self._next_pending < len(self._pending)

    def is_returned(self, value: Value) -> bool:
        """True when a graph of the tree (the root or a body) returns ``value``."""
        return id(value) in self._returned_by

    def is_used(self, value: Value) -> bool:
        return bool(value.users) or id(value) in self._returned_by

    def _still_returned(self, value: Value) -> bool:
        """Whether a graph still in the tree has ``value`` among its outputs."""
        graphs = self._returned_by.get(id(value), [])
        live = []
        for graph in graphs:
            if any(v is value for v in graph.outputs):
                attached = self._attached(graph)
                if attached is None:  # a body whose owner the map does not know
                    return _still_returned(self.root, value)
                if attached:
                    live.append(graph)
        graphs[:] = live
        return bool(live)

    def _attached(self, graph: Graph) -> Optional[bool]:
        """Whether ``graph`` is the root or a body of a live node of the tree (None: unknown)."""
        while graph is not self.root:
            owner = self.owners.get(id(graph))
            if owner is None:
                return None
            if owner.graph is None:
                return False
            graph = owner.graph
        return True

    def forget_returned(self, values: Iterable[Value], body: Graph) -> None:
        """``values`` were returned by ``body``, which no longer returns them (it went
        away with its node, or is an If branch being inlined, its outputs already
        cleared): unmark each, unless another graph of the tree still returns it, so
        that a node whose only reader was the body can be dropped as dead.

        A value defined inside ``body`` is returned by nothing else; one from outside (a
        body returning an outer value directly) is asked of the graphs recorded as
        returning it (_still_returned).
        """
        for value in values:
            if id(value) not in self._returned_by:
                continue
            inside = value.graph is not None and not _is_outside(value, body)
            if inside or not self._still_returned(value):
                del self._returned_by[id(value)]
                self.enqueue_for_liveness(value.producer)

    # -- mutations ---------------------------------------------------------------
    def replace_value(self, old: Value, new: Value) -> None:
        """Every reader of ``old`` (graph outputs included) now reads ``new``."""
        if old is new:
            return
        # A reader sees the same type, constant and contents through ``new`` (a merged
        # duplicate, a SymbolicTensor standing in): it needs a visit, not new types.
        stale = not (old.type == new.type and old.const is new.const and old.shape_contents == new.shape_contents)
        users = [user for user, _ in old.users]
        for user, index in list(old.users):
            user.set_input(index, new)
        # Popped: no graph returns ``old`` now (and its id may be reused).
        graphs = self._returned_by.pop(id(old), None)
        if graphs is not None:
            for graph in graphs:
                graph.outputs = [new if v is old else v for v in graph.outputs]
            returning_new = self._returned_by.setdefault(id(new), [])
            for graph in graphs:
                _add_graph(returning_new, graph)
        for user in users:
            self.enqueue(user, stale)
            self.enqueue(self._owner_in(user, new.graph), stale)
        self.enqueue(new.producer, stale=False)  # it has one more reader, may be live again
        self.changes += 1

    def set_input(self, node: Node, index: int, value: Optional[Value], stale: bool = True) -> None:
        """Make ``node`` read ``value`` at ``index``; ``stale=False`` when what its type
        rule sees there is unchanged (the input became a parameter of the same contents)."""
        old = node.inputs[index]
        node.set_input(index, value)
        self.enqueue(node, stale)
        self.changes += 1
        if old is not None:
            self._reader_gone(old)

    def _reader_gone(self, value: Value) -> None:
        """``value`` lost a reader: if none is left, remove its producer once none of
        the producer's outputs is read, and the producers that leaves unread in turn.

        A value a graph still returns counts as read (is_returned may keep a value
        that is not any more: it then stays, as the worklist's dead check keeps it).
        """
        pending = [value]
        while pending:
            value = pending.pop()
            producer = value.producer
            if producer is None or producer.graph is None or self.is_used(value):
                continue
            for out in producer.outputs:
                if self.is_used(out):
                    # Another output is still read: a rule may be waiting for this one to
                    # go unread (Dropout's mask), which a visit of the producer sees.
                    self.enqueue_for_liveness(producer)
                    break
            else:
                pending.extend(self._detach(producer))
                self.removed_dead += 1

    def remove_node(self, node: Node) -> None:
        """Detach ``node`` (its outputs must be unused); swept from the list by compact().
        Producers it leaves with no output read go too (see _reader_gone)."""
        for out in node.outputs:
            if out.users or (self.is_returned(out) and self._still_returned(out)):
                raise ValueError(f"cannot remove {node.describe()}: {out.name!r} is still used")
        for value in self._detach(node):
            self._reader_gone(value)

    def _detach(self, node: Node) -> list[Value]:
        """Remove ``node`` from the def-use lists (its outputs unread); returns the values
        of the enclosing graphs it (or a body of it) stopped reading."""
        unread = []
        for index, value in enumerate(node.inputs):
            if value is not None:
                value.users.remove((node, index))
                unread.append(value)
        bodies = list(node.subgraphs()) if node.has_subgraphs() else []
        returned = [[v for g in _graphs(sub) for v in g.outputs] for sub in bodies]
        for sub in bodies:
            # Removal is lazy: a body's node list may still hold nodes removed before.
            inner_nodes = [inner for inner in sub.walk_nodes() if inner.graph is not None]
            for inner in inner_nodes:
                for index, value in enumerate(inner.inputs):
                    if value is not None and value.graph is not None and _is_outside(value, sub):
                        value.users.remove((inner, index))
                        unread.append(value)
            for inner in inner_nodes:
                inner.graph = None  # gone with their owner: the worklist skips them
        self._dirty_graphs.add(id(node.graph))
        self._removed.append(node)
        node.graph = None
        for sub, values in zip(bodies, returned):
            self.forget_returned(values, sub)
        self.changes += 1
        return unread

    def add_node(self, graph: Graph, op_type: str, inputs: Sequence[Optional[Value]], num_outputs: int = 1,
                 attrs: Optional[dict[str, Any]] = None, before: Optional[Node] = None, name: str = "",
                 at_start: bool = False) -> Node:
        """A new node, placed just before ``before`` (or at the end), and enqueued.

        ``at_start`` puts it first in its graph instead: right for a node that
        reads nothing of that graph, and O(1) in Python work, where finding
        ``before`` in the node list is O(n).
        """
        index = 0 if at_start else None
        placed = before is not None and not at_start
        if placed and before.graph is not graph:
            # An anchor removed already may have left the list: find it there now
            # (list.index raises if it is gone), as the sweep could not.
            index, placed = graph.nodes.index(before), False
        node = graph.add_node(op_type, inputs, num_outputs, attrs, name=name, index=index)
        if placed:
            self._placements.setdefault(id(graph), {}).setdefault(id(before), []).append(node)
            self._dirty_graphs.add(id(graph))
        anchor = self.order(before) if before is not None else float(len(self._order))
        self._order[id(node)] = anchor - 0.5 / (1 + next(self._tiebreak) % 1000)
        self.enqueue(node)
        self.changes += 1
        return node

    def constant(self, graph: Graph, array: np.ndarray, hint: str = "const") -> Value:
        """A new initializer of ``graph`` holding ``array``."""
        self.changes += 1
        return graph.add_initializer(graph.fresh_name(hint), np.asarray(array))

    def _owner_in(self, node: Node, graph: Optional[Graph]) -> Optional[Node]:
        """The node of ``graph`` whose subgraph contains ``node`` (None if node is in graph)."""
        if graph is None or node.graph is None or node.graph is graph:
            return None
        inner = node.graph
        while inner is not None and inner.parent is not None and inner.parent is not graph:
            inner = inner.parent
        if inner is None or inner.parent is not graph:
            return None
        owner = self.owners.get(id(inner))
        if owner is not None and owner.graph is graph:
            return owner
        # A body the map does not know (its node made by a rule): find its owner.
        for candidate in graph.nodes:
            if candidate.graph is graph and any(s is inner for s in candidate.subgraphs()):
                self.owners[id(inner)] = candidate
                return candidate
        return None

    # -- sweeping ------------------------------------------------------------------
    def compact_graph(self, graph: Graph) -> None:
        """Put the nodes added before others in their places; drop the removed ones."""
        if id(graph) in self._dirty_graphs:
            placements = self._placements.pop(id(graph), None)
            nodes = _placed(graph.nodes, placements) if placements else graph.nodes
            graph.nodes = [n for n in nodes if n.graph is graph]
            self._dirty_graphs.discard(id(graph))

    def release_removed(self) -> None:
        """Unlink the removed nodes from their outputs (node <-> value cycles), so that
        they are freed as soon as the worklist lets go of them, not by a collector pass."""
        for node in self._removed:
            node.inputs = []
            node.outputs = []
        self._removed.clear()

    def compact(self) -> None:
        """Drop removed nodes from every node list, and unused initializers."""
        graphs = list(_graphs(self.root))
        for graph in graphs:
            self.compact_graph(graph)
        self._dirty_graphs.clear()
        for graph in graphs:
            outputs = {id(v) for v in graph.outputs}
            for name, value in list(graph.initializers.items()):
                if not value.users and id(value) not in outputs:
                    del graph.initializers[name]


def _add_graph(graphs: list[Graph], graph: Graph) -> None:
    if all(g is not graph for g in graphs):
        graphs.append(graph)


def _still_returned(root: Graph, value: Value) -> bool:
    return any(v is value for g in _graphs(root) for v in g.outputs)


def _placed(nodes: list[Node], placements: dict[int, list[Node]]) -> list[Node]:
    """``nodes`` with each node of ``placements`` moved to just before its anchor.

    The result is what inserting each node before its anchor at once would have
    given: nodes added before one anchor keep the order they were added in, and a
    node added before an added node goes before that one.
    """
    moved = {id(n) for group in placements.values() for n in group}
    result: list[Node] = []
    for node in nodes:
        if id(node) in moved:
            continue
        # Depth-first: an anchor's added nodes (and theirs) come before it.
        stack = [(node, iter(placements.get(id(node), ())))]
        while stack:
            current, pending = stack[-1]
            child = next(pending, None)
            if child is None:
                stack.pop()
                result.append(current)
            else:
                stack.append((child, iter(placements.get(id(child), ()))))
    return result


def _graphs(root: Graph):
    yield root
    for node in root.nodes:
        if node.graph is None or not node.has_subgraphs():
            continue
        for sub in node.subgraphs():
            yield from _graphs(sub)


def _is_outside(value: Value, sub: Graph) -> bool:
    graph = value.graph
    while graph is not None:
        if graph is sub:
            return False
        graph = graph.parent
    return True
