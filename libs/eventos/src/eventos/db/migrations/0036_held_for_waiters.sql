-- Fewer Signals to a waiting conversation (issue 27 point 2): an entity queued for a turn slot
-- that says it takes what was held for it (patch `take-held-on-grant`) is not sent the inputs
-- of its class or below while it waits; the relay leaves them pending, and the grant of its
-- slot hands them over (eventos.delivery.held). Waiters of older entities take nothing.
ALTER TABLE sched_waiters ADD COLUMN takes_held boolean NOT NULL DEFAULT false;
