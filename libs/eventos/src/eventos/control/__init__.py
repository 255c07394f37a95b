"""Employee control in Temporal (SPEC I2, I10, §7): the intent deliverer applies each owner
intent to its supervisor or entity by workflow id until applied (`intent_deliverer`, run by the
relay), and `supervisor` makes a generation's control state true in Temporal (the supervisor's
activities, the deliverer and re-arm use it)."""
