"""Recovery decisions (pure): the transition table's record, the budget, what a
worker's outcome, a verdict, a scheduler's due item or an operator's action means."""
