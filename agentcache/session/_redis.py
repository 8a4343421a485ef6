"""The Redis session store: several proxy replicas behind one load balancer share sessions, generations and
the prefix index (``redis.asyncio``; one Redis server or a primary with replicas, not Redis Cluster). An
:class:`~agentcache.session.AsyncSessionStore`: the :class:`~agentcache.Sessions` manager drives it with its
``a``-prefixed methods, under the same contract as the in-memory store.

Layout (``P`` is ``redis_prefix``, ``T`` the tenant hash)::

    P:T:s:<sid>   hash   gen, closed, reason, ver, turns, seen, lineage, parent, explicit, idx, state
    P:T:idx       hash   checkpoint hex -> "<1 head | 0 inner>|<sid>"
    P:live        zset   "T<TAB>sid" scored by the last time any replica saw the session

Every update is one Lua script, so it is atomic across replicas: ``open`` creates generation 0 or, for a
closed id, the next generation; ``commit`` applies only when the session is still open in the generation the
request was prepared in (a late response for a closed or newer generation changes nothing), bumps ``ver`` and
moves the session's index entries; ``close`` ends a generation once (later closes are no-ops). ``state`` is the
pipeline's memory (the last request sent and the client's original as a delta of it, compressed, plus timing and
learned hints; :mod:`._redis_state`): a replica whose local copy is at another ``ver`` rebuilds the pipeline from it.
A closed session keeps a tombstone (its generation) for ``tombstone_ttl`` seconds; open sessions expire after
``session_ttl``.

Fail open: a Redis error raises :class:`~agentcache.proxy._store.StoreUnavailable` (the proxy forwards the
request unchanged, logs and counts it) and for the next ``retry_after`` seconds calls fail fast instead of
waiting on a dead server again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from .._log import get_logger
from ._identity import Checkpoints, index_entries, match_checkpoints
from ._redis_state import pack, unpack
from ._snapshot import snapshot
from ._store import Opened, SessionFactory, StoreUnavailable

if TYPE_CHECKING:
    from ._pipeline import Prepared
    from ._session import Session

__all__ = ["RedisStore"]

log = get_logger("agentcache.session")
T = TypeVar("T")

_DROP_IDX = """
local function drop_idx(skey, idx, sid)
  local old = redis.call('HGET', skey, 'idx')
  if old and old ~= '' then
    for f in string.gmatch(old, '[^,]+') do
      local v = redis.call('HGET', idx, f)
      if v and string.sub(v, 3) == sid then redis.call('HDEL', idx, f) end
    end
  end
end
"""

# KEYS: idx | ARGV: checkpoint hexes joined by ',' | the hits only, as field, value, field, value...: one argument
# to send instead of one per checkpoint (a 46 KB conversation has ~380), and only the few hits back
_FIND = """
local out = {}
for f in string.gmatch(ARGV[1], '[^,]+') do
  local v = redis.call('HGET', KEYS[1], f)
  if v then out[#out + 1] = f; out[#out + 1] = v end
end
return out
"""

# KEYS: session, live, parent session | ARGV: now, parent, (unused), explicit, local ver, sid, member, ttl
_OPEN = """
local s = redis.call('HMGET', KEYS[1], 'gen', 'closed', 'reason')
local reason = ''
if (not s[1]) or s[2] == '1' then
  local gen = 0
  reason = 'new'
  if s[1] then
    gen = tonumber(s[1]) + 1
    if s[3] == 'idle' or s[3] == 'evicted' then reason = 'resumed' else reason = 'restart' end
    redis.call('DEL', KEYS[1])
  end
  local lineage = ARGV[6]
  if ARGV[2] ~= '' then lineage = redis.call('HGET', KEYS[3], 'lineage') or ARGV[2] end
  redis.call('HSET', KEYS[1], 'gen', gen, 'closed', 0, 'ver', 0, 'turns', 0, 'lineage', lineage,
             'parent', ARGV[2], 'explicit', ARGV[4], 'idx', '')
end
redis.call('HSET', KEYS[1], 'seen', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[8])
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[7])
local r = redis.call('HMGET', KEYS[1], 'gen', 'ver', 'lineage', 'parent', 'turns', 'explicit')
local state = ''
if r[2] ~= ARGV[5] then state = redis.call('HGET', KEYS[1], 'state') or '' end
return {reason, r[1], r[2], r[3], r[4], r[5], r[6] or '1', state}
"""

# KEYS: session, idx, live | ARGV: gen, now, state, entries "hex:h,...", sid, member, ttl, base ver
_COMMIT = (
    _DROP_IDX
    + """
local s = redis.call('HMGET', KEYS[1], 'gen', 'closed', 'ver')
if (not s[1]) or tonumber(s[1]) ~= tonumber(ARGV[1]) or s[2] == '1' then return -1 end
if tonumber(s[3]) ~= tonumber(ARGV[8]) then return -1 end
drop_idx(KEYS[1], KEYS[2], ARGV[5])
local fields = {}
for h, head in string.gmatch(ARGV[4], '([^:,]+):(%d)') do
  redis.call('HSET', KEYS[2], h, head .. '|' .. ARGV[5])
  table.insert(fields, h)
end
if #fields > 0 then redis.call('EXPIRE', KEYS[2], ARGV[7]) end
local ver = redis.call('HINCRBY', KEYS[1], 'ver', 1)
redis.call('HINCRBY', KEYS[1], 'turns', 1)
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'idx', table.concat(fields, ','), 'seen', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[6])
return ver
"""
)

# KEYS: session, idx, live | ARGV: reason, member, sid, tombstone ttl, idle cutoff ('' for none)
_CLOSE = (
    _DROP_IDX
    + """
local s = redis.call('HMGET', KEYS[1], 'gen', 'closed', 'lineage', 'parent', 'turns', 'seen', 'explicit')
if not s[1] then redis.call('ZREM', KEYS[3], ARGV[2]) return false end
if s[2] == '1' then return false end
if ARGV[5] ~= '' and tonumber(s[6] or '0') > tonumber(ARGV[5]) then return false end
drop_idx(KEYS[1], KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'closed', 1, 'reason', ARGV[1], 'idx', '')
redis.call('HDEL', KEYS[1], 'state')
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[2])
return {s[1], s[3], s[4], s[5], s[7]}
"""
)


#: How many of a request's deepest items :meth:`RedisStore.find` looks up first: a turn appends its answer and
#: the next user message (2), an agent's tool round a few more; deeper than this is looked up in a second call.
FIND_WINDOW = 8


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisStore:
    """An :class:`~agentcache.session.AsyncSessionStore` in Redis (see the module docstring). ``client``: a
    ``redis.asyncio.Redis``. Local copies of sessions are kept for at most ``max_open`` sessions and
    ``max_bytes`` of estimated state (the shared state is authoritative)."""

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "agentcache",
        max_open: int = 10_000,
        max_bytes: int = 256 * 1024 * 1024,
        min_inner_match: int = 2,
        session_ttl: float = 24 * 3600.0,
        tombstone_ttl: float = 24 * 3600.0,
        retry_after: float = 2.0,
    ) -> None:
        self.redis = client
        self.prefix = prefix
        self.max_open, self.max_bytes = max_open, max_bytes
        self._bytes = 0
        self.min_inner_match = min_inner_match
        self.session_ttl, self.tombstone_ttl = int(session_ttl), int(tombstone_ttl)
        self.retry_after = retry_after
        self._down_until = 0.0
        self._down_since = 0.0  # monotonic time of the first failure of the current outage (0: none)
        self._local: OrderedDict[tuple[str, str], Session] = OrderedDict()
        self.manager: Any = None
        self._find = client.register_script(_FIND)
        self._open = client.register_script(_OPEN)
        self._commit = client.register_script(_COMMIT)
        self._close = client.register_script(_CLOSE)

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 0.5, **limits: Any) -> RedisStore:
        """A store on the Redis at ``url`` (``redis://host:port/db``); ``timeout``: socket seconds; ``limits``: the
        keyword arguments of the constructor."""
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        return cls(client, **limits)

    # ---- keys and the breaker ----------------------------------------------------------------------

    def _skey(self, tenant: str, sid: str) -> str:
        return f"{self.prefix}:{tenant}:s:{sid}"

    def _idx(self, tenant: str) -> str:
        return f"{self.prefix}:{tenant}:idx"

    @property
    def _live(self) -> str:
        return f"{self.prefix}:live"

    async def _call(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        if time.monotonic() < self._down_until:
            raise StoreUnavailable(f"redis marked down ({op})", op=op)
        try:
            result = await call()
        except Exception as exc:
            if not self._down_since:
                self._down_since = time.monotonic()
            self._down_until = time.monotonic() + self.retry_after
            log.warning("store.unavailable", store="redis", op=op, error=type(exc).__name__, detail=str(exc)[:200])
            raise StoreUnavailable(f"redis {op}: {type(exc).__name__}", op=op) from exc
        if self._down_since:  # one line when it answers again, with how long it did not
            log.info("store.available", store="redis", op=op, down_s=round(time.monotonic() - self._down_since, 3))
            self._down_since = 0.0
        return result

    # ---- the AsyncSessionStore interface -------------------------------------------------------------

    async def find(self, tenant: str, checkpoints: Checkpoints) -> str | None:
        """The live inferred session a request with ``checkpoints`` continues. One script reads the keyed heads of
        the request's deepest :data:`FIND_WINDOW` items first: a turn that continues its session finds its head
        there, the deepest, so the answer is the one the whole lookup gives; only without a head there does a second
        call read every checkpoint (a new conversation, a changed prefix, a resume)."""
        n = len(checkpoints)
        if not n:
            return None
        window = [checkpoints.key(k) for k in range(n - 2, max(n - 2 - FIND_WINDOW, -1), -1)]
        hits = await self._hits(tenant, window)
        if not any(head for _, head in hits.values()):
            hits = await self._hits(tenant, checkpoints.lookups(self.min_inner_match))
        return match_checkpoints(checkpoints, hits.get, self.min_inner_match)

    async def _hits(self, tenant: str, lookups: Iterable[bytes]) -> dict[bytes, tuple[str, bool]]:
        """``{hash: (session id, is a head)}`` of those of ``lookups`` the index holds (one script call)."""
        fields = ",".join(h.hex() for h in lookups)
        found = await self._call("find", lambda: self._find(keys=[self._idx(tenant)], args=[fields]))
        hits: dict[bytes, tuple[str, bool]] = {}
        for h, v in zip(found[::2], found[1::2], strict=True):
            text = _s(v)
            hits[bytes.fromhex(_s(h))] = (text[2:], text[:1] == "1")
        return hits

    def bind(self, manager: Any) -> None:
        """The manager whose sessions these are (sessions this replica closes without holding a copy get it)."""
        self.manager = manager

    async def open(
        self,
        tenant: str,
        sid: str,
        *,
        parent: str | None,
        explicit: bool,
        now: float,
        create: SessionFactory,
        reuse: Session | None,
    ) -> Opened:
        """The live session ``(tenant, sid)``, opened when needed; the local copy is rebuilt from the shared
        snapshot when another replica moved the session on."""
        key = (tenant, sid)
        local = self._local.get(key)
        keys = [self._skey(tenant, sid), self._live, self._skey(tenant, parent or sid)]
        args = [now, parent or "", "", int(explicit), local.version if local else -1, sid, f"{tenant}\t{sid}"]
        args.append(self.session_ttl)
        raw = await self._call("open", lambda: self._open(keys=keys, args=args))
        reason, gen, ver, lineage, parent_s, turns, expl = (_s(x) for x in raw[:7])
        state = raw[7]
        gen_i, ver_i = int(gen), int(ver)
        if local is not None and local.generation == gen_i and local.version == ver_i and not local.closed:
            self._local.move_to_end(key)
            local.last_active = now
            return Opened(local)
        doc = unpack(state) if state else None
        sess = create(tenant, sid, parent_s or None, lineage, gen_i, doc)
        sess.version, sess.turns, sess.explicit, sess.last_active = ver_i, int(turns), expl != "0", now
        if local is not None and local.generation == gen_i:
            sess.attempt, sess.totals = local.attempt, local.totals
        old = self._local.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        self._local[key] = sess
        self._trim()
        return Opened(sess, reason or None)

    async def commit(
        self, session: Session, prepared: Prepared, *, base: int, checkpoints: Checkpoints, now: float
    ) -> bool:
        """Record ``prepared`` as sent if the session is still at version ``base`` in Redis (atomic)."""
        assert session.target is not None
        state = pack(snapshot(prepared.state, session.target), session.pipeline.cache.raw)
        entries = ""
        if not session.explicit:
            pairs = index_entries(checkpoints, self.min_inner_match)
            entries = ",".join(f"{h.hex()}:{int(head)}" for h, head in pairs)
        keys = [self._skey(session.tenant, session.session_id), self._idx(session.tenant), self._live]
        at = prepared.at if prepared.at is not None else now
        args = [session.generation, at, state, entries, session.session_id, f"{session.tenant}\t{session.session_id}"]
        args += [self.session_ttl, base]
        ver = int(await self._call("commit", lambda: self._commit(keys=keys, args=args)))
        if ver < 0:
            return False
        session.pipeline.commit(prepared)
        session.version, session.turns = ver, session.turns + 1
        session.last_active = max(session.last_active, at)
        size = session.estimated_bytes()
        if self._local.get((session.tenant, session.session_id)) is session:
            self._bytes += size - session.size
        session.size = size
        self._trim()
        return True

    def _trim(self) -> None:
        """Drop the least recently used local copies beyond the count and byte limits (the sessions live on in
        Redis; a later request rebuilds its copy)."""
        while len(self._local) > 1 and (len(self._local) > self.max_open or self._bytes > self.max_bytes):
            _, old = self._local.popitem(last=False)
            self._bytes -= old.size

    async def close(self, tenant: str, sid: str, *, reason: str, now: float) -> Session | None:
        """Close the live generation of ``(tenant, sid)`` in Redis; None when there is none."""
        return await self._close_one(tenant, sid, reason, "")

    async def _close_one(self, tenant: str, sid: str, reason: str, cutoff: str) -> Session | None:
        keys = [self._skey(tenant, sid), self._idx(tenant), self._live]
        args = [reason, f"{tenant}\t{sid}", sid, self.tombstone_ttl, cutoff]
        raw = await self._call("close", lambda: self._close(keys=keys, args=args))
        local = self._local.pop((tenant, sid), None)
        if local is not None:
            self._bytes -= local.size
        if not raw:
            return None
        gen, lineage, parent, turns, _explicit = (_s(x) for x in raw)
        if local is not None and local.generation == int(gen):
            local.turns = int(turns)
            local.retire(reason)
            return local
        from ._session import Session

        sess = Session(self.manager, tenant, sid, parent or None, lineage, int(gen))
        sess.turns = int(turns)
        sess.retire(reason)
        return sess

    async def sweep(self, now: float, idle: float) -> list[Session]:
        """Close every session idle for more than ``idle`` seconds (at most 500 per call; each closed by one
        replica only)."""
        cutoff = now - idle
        members = await self._call(
            "sweep", lambda: self.redis.zrangebyscore(self._live, "-inf", cutoff, start=0, num=500)
        )
        out: list[Session] = []
        for m in members:
            tenant, _, sid = _s(m).partition("\t")
            sess = await self._close_one(tenant, sid, "idle", repr(cutoff))
            if sess is not None:
                out.append(sess)
        return out

    def live(self) -> int:
        """Sessions this replica holds a local copy of."""
        return len(self._local)

    @property
    def local_bytes(self) -> int:
        """Estimated bytes of the local copies (bounded by ``max_bytes``)."""
        return self._bytes

    def get(self, tenant: str, sid: str) -> Session | None:
        """This replica's local copy of ``(tenant, sid)``, or None."""
        return self._local.get((tenant, sid))

    async def ping(self) -> bool:
        """A Redis ``PING`` within the client's socket timeout (False rather than raising)."""
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    async def aclose(self) -> None:
        """Close the Redis connection pool."""
        try:
            await self.redis.aclose()
        except Exception as exc:  # closing a dead connection must not fail shutdown
            log.warning("store.close_failed", store="redis", error=type(exc).__name__)
