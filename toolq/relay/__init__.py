"""The relay: publishes the ledger's outbox to the Celery broker (outbox mode).

:mod:`toolq.relay.outgoing` reads an outbox entry (pure); :mod:`toolq.relay.service`
is the process (``toolq relay``).
"""
