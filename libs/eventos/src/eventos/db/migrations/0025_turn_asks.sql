-- Fault run (issue 17): the entity's key of the ask that granted a turn (its run id and the
-- ask's number). An ask repeated because its answer was lost (a retried workflow task, a
-- connection dropped after the commit) is given the turn already granted instead of a second
-- turn whose slot nothing would ever give back.
ALTER TABLE turns ADD COLUMN ask text;
CREATE INDEX turns_ask ON turns (ask) WHERE ask IS NOT NULL;
