"""What a position's KV is computed under: the whole prefix, not the token.

The KV at position ``p`` of a request depends on every token up to ``p``
and on what vLLM folds into a block's hash besides the tokens (the cache
salt, the LoRA adapter, the prompt embeddings, each multimodal item placed
at or before ``p``): two positions hold the same KV only when all of that
agrees. :class:`PrefixIdentities` keeps, per request, a running digest of
it, one per position, so that a block holding "position 9, token 5" under
one first block is told from one holding it under another.

A digest is Python's ``hash`` of the digest before it, the token and the
items placed there: equal contexts give equal digests within one process,
which is all the contents model compares (it never leaves the process).

Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = [
    "PrefixIdentities", "lora_identity", "namespace_of", "namespace_within", "prompt_embedding_rows", "split_namespace",
]


def namespace_of(cache_salt: str | None, lora: str | None, embeds: str | None = None,
                 items: Iterable[tuple[str, int]] = ()) -> str:
    """A request's namespace: what vLLM folds into its blocks' hashes besides
    the tokens (its cache salt, its LoRA adapter, the prompt embeddings it
    sends in place of token ids, and each multimodal item's identifier at
    its placeholder's offset, one ``mm:identifier@offset`` part per item of
    ``items``); "" for none."""
    parts = [*([cache_salt] if cache_salt else []), *([f"lora:{lora}"] if lora else [])]
    parts += [*([f"embeds:{embeds}"] if embeds else []), *(f"mm:{i}@{o}" for i, o in sorted(items, key=lambda x: x[1]))]
    return "+".join(parts)


def namespace_within(namespace: str, end: int) -> str:
    """The part of ``namespace`` that names a request's first ``end``
    tokens: vLLM chains each block's hash on the one before, and folds a
    multimodal item into every block its placeholder overlaps, so a prefix
    stands under the items whose placeholders start before its end."""
    parts = namespace.split("+") if namespace else []
    return "+".join(p for p in parts if not p.startswith("mm:") or int(p.rsplit("@", 1)[1]) < end)


def prompt_embedding_rows(tag: str, num_tokens: int, width: int = 4) -> list[list[float]]:
    """The prompt embeddings a request tagged ``tag`` sends, one row of
    ``width`` values per position: the same tag gives the same rows (two
    such requests may share cached KV), another tag other rows at every
    position."""
    seed = sum(map(ord, tag))
    return [[float((seed * 131 + 17 * i + j) % 251) for j in range(width)] for i in range(num_tokens)]


def lora_identity(name: str) -> tuple[str, int, str]:
    """The ``LoRARequest`` fields of the adapter ``name`` (its name, an
    integer id and a path of its own): vLLM hashes the name into every block
    of a request under it."""
    return name, 1 + sum(map(ord, name)) % 1000, f"adapters/{name}"


def split_namespace(namespace: str) -> tuple[tuple[str, ...], dict[int, tuple[str, ...]]]:
    """A namespace (``fuzz.adapter._contents.namespace_of``) as (the parts
    every position is computed under: cache salt, ``lora:``, ``embeds:``;
    per position, the multimodal items whose placeholder starts there)."""
    whole: list[str] = []
    items: dict[int, list[str]] = {}
    for part in namespace.split("+") if namespace else ():
        if part.startswith("mm:"):
            name, at = part[3:].rsplit("@", 1)
            items.setdefault(int(at), []).append(name)
        else:
            whole.append(part)
    return tuple(whole), {at: tuple(sorted(names)) for at, names in items.items()}


class PrefixIdentities:
    """Per request, the identity of the context each of its positions' KV
    is computed under (see the module docstring), kept incrementally: a
    request's tokens grow at the end, and where they change (a rollback,
    a preemption that discards tokens) the digests from there are redone."""

    def __init__(self) -> None:
        # Request id -> (its namespace, the tokens digested, their digests).
        self._known: dict[str, tuple[str, list[int], list[int]]] = {}
        self._namespaces: dict[str, tuple[tuple[str, ...], dict[int, tuple[str, ...]]]] = {}

    def of(self, request_id: str, namespace: str, tokens: Sequence[int]) -> list[int]:
        """The digests of ``tokens``' positions for ``request_id`` under
        ``namespace``: entry ``p`` names the first ``p + 1`` tokens and the
        namespace as far as they go."""
        known = self._known.get(request_id)
        if known is None or known[0] != namespace:
            known = self._known[request_id] = (namespace, [], [])
        _, seen, digests = known
        common = min(len(seen), len(tokens))
        if seen[:common] != list(tokens[:common]):
            common = next(i for i, (a, b) in enumerate(zip(seen, tokens)) if a != b)
        if common < len(seen) and common < len(tokens):
            del seen[common:], digests[common:]
        split = self._namespaces.get(namespace)
        if split is None:
            split = self._namespaces[namespace] = split_namespace(namespace)
        whole, items = split
        last = digests[-1] if digests else hash(("prefix", whole))
        for p in range(len(seen), len(tokens)):
            last = hash((last, tokens[p], items.get(p, ())))
            seen.append(tokens[p])
            digests.append(last)
        return digests[: len(tokens)]

    def forget(self, request_id: str) -> None:
        self._known.pop(request_id, None)
