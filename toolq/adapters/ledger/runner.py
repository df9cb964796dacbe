"""How a client runs the ledger's scripts: ``FCALL`` of the library where the server
has functions, else ``EVALSHA`` of each script; loaded on first use, and again when
the server lost them (a restart without persistence, a flush).

:class:`ScriptWay` decides (no I/O): what command runs a script, what a failed
load or call says. :class:`Scripts` and :class:`AsyncScripts` only send.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from toolq.adapters.ledger import scripts


def lost_scripts(reply: object) -> bool:
    """A reply that says the server lost the scripts (a restart, a flush): load them again."""
    if isinstance(reply, redis.exceptions.NoScriptError):
        return True
    return isinstance(reply, redis.ResponseError) and "function not found" in str(reply).lower()


def functions_refused(exc: redis.ResponseError) -> bool:
    """FUNCTION LOAD's error on a server that has no functions (or will not let us load)."""
    text = str(exc).lower()
    return "unknown command" in text or "unknown subcommand" in text or "noperm" in text


class ScriptWay:
    """How one client runs the ledger's scripts, what :class:`Scripts` and
    :class:`AsyncScripts` share (no I/O here).

    ``replace``: FUNCTION LOAD with REPLACE. A Cluster client needs it: FUNCTION LOAD
    stops at the first primary that answers "already exists", and a primary that
    lacks the library (a node added empty) would never get it. The library's name is
    a hash of its code, so replacing it replaces it with itself. A replica has what
    its primary loaded (functions replicate): a failover loses nothing.
    """

    client: Any

    def __init__(self, replace: bool) -> None:
        #: None until the first load says whether the server has functions.
        self.functions: bool | None = None
        self.replace = replace
        self._evals: dict[str, Any] = {}

    def raw(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """The command that runs script ``name``, once loaded (:attr:`functions` known)."""
        if self.functions:
            return ["FCALL", scripts.function_name(name), len(keys), *keys, *args]
        return ["EVALSHA", self.sha(name), len(keys), *keys, *args]

    def fcall(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The arguments of the client's ``fcall`` that runs script ``name``."""
        return (scripts.function_name(name), len(keys), *keys, *args)

    def sha(self, name: str) -> str:
        return str(self._eval(name).sha)

    def _eval(self, name: str) -> Any:
        """The script object of ``name`` (EVALSHA's way): the client's, sync or async."""
        script = self._evals.get(name)
        if script is None:
            script = self._evals[name] = self.client.register_script(scripts.script(name))
        return script

    def refused(self, exc: redis.ResponseError) -> None:
        """What a FUNCTION LOAD that failed says: the library is there already (another
        process loaded it), or the server has no functions; anything else is raised."""
        if "already exists" in str(exc):
            self.functions = True
        elif functions_refused(exc):
            self.functions = False
        else:
            raise exc

    def reload(self, exc: redis.ResponseError) -> None:
        """A call failed: returns when the server lost the scripts (load and call
        again), raises anything else."""
        if not lost_scripts(exc):
            raise exc


class Scripts(ScriptWay):
    """Runs the ledger's scripts on one client (:class:`ScriptWay`). Thread-safe:
    loading twice is harmless. ``replace`` None: as the client is (a Cluster's or not)."""

    def __init__(self, client: redis.Redis, *, replace: bool | None = None) -> None:
        super().__init__(isinstance(client, RedisCluster) if replace is None else replace)
        self.client: redis.Redis = client

    def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if self.functions is None:
            self.load()
        if not self.functions:
            return self._eval(name)(keys=keys, args=args)
        try:
            return self.client.fcall(*self.fcall(name, keys, args))
        except redis.ResponseError as exc:
            self.reload(exc)
        self.load()
        return self.client.fcall(*self.fcall(name, keys, args))

    def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """The raw command that runs script ``name`` (for a pipeline or a connection)."""
        if self.functions is None:
            self.load()
        return self.raw(name, keys, args)

    def load(self) -> None:
        """Load the library (or, without functions, every script) into the server; on
        a Cluster into every primary (redis-py sends FUNCTION LOAD and SCRIPT LOAD to
        all of them)."""
        if self.functions is not False:
            try:
                self.client.function_load(scripts.library(), replace=self.replace)
                self.functions = True
            except redis.ResponseError as exc:
                self.refused(exc)
        if not self.functions:
            for name in scripts.NAMES:
                script = self._eval(name)
                script.sha = self.client.script_load(script.script)


class AsyncScripts(ScriptWay):
    """:class:`Scripts` on ``redis.asyncio``."""

    def __init__(self, client: aioredis.Redis, *, replace: bool | None = None) -> None:
        super().__init__(isinstance(client, AsyncRedisCluster) if replace is None else replace)
        self.client: aioredis.Redis = client

    async def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if self.functions is None:
            await self.load()
        if not self.functions:
            return await self._eval(name)(keys=keys, args=args)
        try:
            return await self.client.fcall(*self.fcall(name, keys, args))
        except redis.ResponseError as exc:
            self.reload(exc)
        await self.load()
        return await self.client.fcall(*self.fcall(name, keys, args))

    async def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        if self.functions is None:
            await self.load()
        return self.raw(name, keys, args)

    async def load(self) -> None:
        if self.functions is not False:
            try:
                await self.client.function_load(scripts.library(), replace=self.replace)
                self.functions = True
            except redis.ResponseError as exc:
                self.refused(exc)
        if not self.functions:
            for name in scripts.NAMES:
                script = self._eval(name)
                script.sha = await self.client.script_load(script.script)
