"""The relay: publishes the ledger's outbox to the Celery broker (outbox mode).

:mod:`toolq.services.relay.outgoing` reads an outbox entry (pure);
:mod:`toolq.services.relay.service`
is the process (``toolq relay``).
"""
