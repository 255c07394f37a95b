-- Why an input waits (issue 26 point 3): a turn that waits for an approval is read with its
-- approval, by the turn (`waiting_turns`, the chat message's answer).
CREATE INDEX approvals_turn ON approvals (turn_id);
