"""The process groups a rank's trace lists (``distributedInfo``'s ``pg_config``), and which of
them hold the rank: what names a collective's group, its size and its ranks, and what a peer named
by its rank in an unnamed group can be (sptrace.detect.collective_record asks; sptrace.reduce.peers
settles the candidates once every rank is there)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from sptrace.load.trace import RankTrace


@dataclass(frozen=True)
class Group:
    """A process group as ``distributedInfo`` lists it (ranks: None where not a list of ints)."""

    name: str
    size: int | None
    ranks: list[int] | None


class PeerCandidate(TypedDict):
    """What a peer named by its rank in an unnamed group can be (a ``peer_candidates`` cell's
    entries, which resolve_peers reads): its global rank in one of this rank's groups."""

    peer: int
    group: str
    size: int | None
    ranks: list[int] | None


class GroupTable:
    """The process groups ``distributedInfo`` lists, and which of them hold this rank."""

    def __init__(self, trace: RankTrace) -> None:
        self.rank = trace.rank
        self.by_name: dict[str, Group] = {}
        self.mine: list[Group] = []
        for g in trace.process_groups:
            if not isinstance(g, dict):
                continue
            ranks = g.get("ranks")
            ranks = ranks if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks) else None
            size = g.get("pg_size") if isinstance(g.get("pg_size"), int) else (len(ranks) if ranks else None)
            entry = Group(str(g.get("pg_name")), size, ranks)
            self.by_name[entry.name] = entry
            if ranks is not None and trace.rank in ranks:
                self.mine.append(entry)

    def peer_candidates(self, local: int) -> list[PeerCandidate]:
        """What a peer named by its rank in an unnamed group can be: in each of this rank's
        groups that has such a rank, its global rank."""
        return [
            PeerCandidate(peer=int(g.ranks[local]), group=g.name, size=g.size, ranks=g.ranks)
            for g in self.mine
            if g.ranks and 0 <= local < len(g.ranks) and g.ranks[local] != self.rank  # not itself
        ]

    def resolve(self, name: str | None, size: int | None) -> tuple[str | None, int | None, list | None, str | None]:
        """(group, size, ranks, how) from what the collective itself said (its group's name or
        size), else from this rank's groups when they leave one answer."""
        if name is not None and name in self.by_name:
            g = self.by_name[name]
            return g.name, size or g.size, g.ranks, None
        candidates = [g for g in self.mine if size is None or g.size == size]
        if len(candidates) == 1:
            g = candidates[0]
            sized = f" of size {size}" if size else ""
            how = f"the only process group{sized} holding rank {self.rank}"
            return g.name, g.size, g.ranks, f"distributedInfo ({how})"
        if candidates and len({g.size for g in candidates}) == 1 and size is None:
            same_ranks = len({tuple(g.ranks) for g in candidates}) == 1
            how = f"every process group holding rank {self.rank} has {candidates[0].size} ranks"
            return (
                None,
                candidates[0].size,
                candidates[0].ranks if same_ranks else None,
                f"distributedInfo ({how})",
            )
        return name, size, None, None
