"""The deployment's topology (wt-seam writes this package; placeholder so that
:mod:`toolq.topology.ledger` imports before the merge: take wt-seam's)."""
