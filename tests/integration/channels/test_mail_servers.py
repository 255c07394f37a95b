"""The loopback mail servers of tests/mail_servers.py, driven by the standard library's clients
(smtplib, imaplib) as the email channel's tests will drive them: what SMTP accepts is in the
recipient's INBOX over IMAP; UIDs, UIDVALIDITY, \\Seen, STORE, UID SEARCH and IDLE behave as a
real IMAP server's; the scripted faults answer with the chosen codes."""

from __future__ import annotations

import imaplib
import re
import smtplib
import socket
from email.message import EmailMessage
from email.utils import make_msgid

import pytest
from mail_servers import MailServers, MailUser


def outgoing(sender: MailUser, to: MailUser, subject: str = "Order 42") -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender.address
    message["To"] = to.address
    message["Subject"] = subject
    message["Message-ID"] = make_msgid(domain="acme.test")
    message.set_content("Your order ships today.")
    return message


def send(mail: MailServers, sender: MailUser, message: EmailMessage) -> None:
    with smtplib.SMTP(mail.host, mail.smtp_port, timeout=10) as client:
        client.login(sender.address, sender.password)
        client.send_message(message)


def uids(client: imaplib.IMAP4, *criteria: str) -> list[int]:
    status, data = client.uid("SEARCH", *criteria)
    assert status == "OK", data
    return [int(u) for u in (data[0] or b"").split()]


def uid_validity(client: imaplib.IMAP4, mailbox: str = "INBOX") -> int:
    status, data = client.status(mailbox, "(UIDVALIDITY)")
    assert status == "OK", data
    match = re.search(rb"UIDVALIDITY (\d+)", data[0] or b"")
    assert match is not None, data
    return int(match.group(1))


def fetch_flags(client: imaplib.IMAP4, uid: int) -> bytes:
    status, data = client.uid("FETCH", str(uid), "(FLAGS)")
    assert status == "OK", data
    first = data[0]
    assert isinstance(first, bytes), data
    return first


def test_a_sent_mail_is_in_the_recipients_inbox_with_its_message_id(mail: MailServers) -> None:
    employee, customer = mail.new_user("employee"), mail.new_user("customer")
    message = outgoing(employee, customer)
    message_id = message["Message-ID"]

    send(mail, employee, message)

    with mail.imap(customer) as client:
        client.select("INBOX")
        found = uids(client, "HEADER", "Message-ID", message_id)
        assert len(found) == 1
        status, data = client.uid("FETCH", str(found[0]), "(BODY.PEEK[])")
        assert status == "OK"
        raw = data[0]
        assert isinstance(raw, tuple)
        assert b"Subject: Order 42" in raw[1]
        assert b"Your order ships today." in raw[1]
    [accepted] = mail.accepted(customer)
    assert accepted.message_id == message_id
    assert accepted.mail_from == employee.address
    assert accepted.rcpt_tos == (customer.address,)
    assert accepted.auth_login == employee.address
    assert not accepted.reply_dropped
    # The provider keeps the sender's copy: a sender can look a Message-ID up before resending.
    assert [s.message_id for s in mail.messages(employee, "Sent")] == [message_id]
    assert mail.messages(employee) == []


def test_unseen_search_fetch_and_store_seen(mail: MailServers) -> None:
    employee = mail.new_user("employee")
    ids = [
        mail.deliver_inbound(employee, "c@customer.test", f"question {n}", f"body {n}")[0]
        for n in range(3)
    ]

    with mail.imap(employee) as client:
        client.select("INBOX")
        unseen = uids(client, "UNSEEN")
        assert len(unseen) == 3
        status, data = client.uid(
            "FETCH", str(unseen[0]), "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])"
        )
        assert status == "OK"
        raw = data[0]
        assert isinstance(raw, tuple)
        assert ids[0].encode() in raw[1]
        assert uids(client, "UNSEEN") == unseen, "a PEEK must not set \\Seen"

        status, _ = client.uid("STORE", str(unseen[0]), "+FLAGS", "(\\Seen)")
        assert status == "OK"

        assert b"\\Seen" in fetch_flags(client, unseen[0])
        assert uids(client, "UNSEEN") == unseen[1:]
        assert uids(client, "SEEN") == unseen[:1]

        # As on any IMAP server, a FETCH of BODY[] (not PEEK) marks the message read itself:
        # a poller that marks as read only after its commit must fetch with BODY.PEEK[].
        status, _ = client.uid("FETCH", str(unseen[1]), "(BODY[])")
        assert status == "OK"
        assert uids(client, "UNSEEN") == unseen[2:]
    by_id = {s.message_id: s for s in mail.messages(employee)}
    assert by_id[ids[0]].seen and by_id[ids[1]].seen
    assert not by_id[ids[2]].seen


def test_uids_increase_and_uidvalidity_holds_across_sessions(mail: MailServers) -> None:
    employee, customer = mail.new_user("employee"), mail.new_user("customer")
    _, first = mail.deliver_inbound(employee, customer.address, "one", "1")
    send(mail, customer, outgoing(customer, employee, "two"))
    with mail.imap(employee) as client:
        client.select("INBOX")
        validity = uid_validity(client)
        seen_uids = uids(client, "ALL")
    _, third = mail.deliver_inbound(employee, customer.address, "three", "3")

    with mail.imap(employee) as client:
        assert uid_validity(client) == validity
        client.select("INBOX")
        assert uids(client, "UID", f"{seen_uids[-1] + 1}:*") == [third]
    assert seen_uids[0] == first
    assert seen_uids == sorted(seen_uids) and len(set(seen_uids)) == 2
    assert third > seen_uids[-1]
    assert mail.uid_validity(employee) == validity
    assert [s.uid for s in mail.messages(employee)] == [*seen_uids, third]


def test_a_renewed_inbox_has_a_new_uidvalidity_and_the_same_mail(mail: MailServers) -> None:
    employee = mail.new_user("employee")
    ids = [mail.deliver_inbound(employee, "c@customer.test", s, s)[0] for s in ("a", "b")]
    with mail.imap(employee) as client:
        client.select("INBOX")
        client.uid("STORE", str(uids(client, "ALL")[0]), "+FLAGS", "(\\Seen)")
        before = uid_validity(client)

    after = mail.renew_inbox(employee)
    _, third = mail.deliver_inbound(employee, "c@customer.test", "c", "c")

    assert after != before
    with mail.imap(employee) as client:
        assert uid_validity(client) == after
        client.select("INBOX")
        assert uids(client, "ALL")[-1] == third
    stored = mail.messages(employee)
    assert [s.message_id for s in stored][:2] == ids
    assert [s.seen for s in stored] == [True, False, False]


@pytest.mark.parametrize("code", [421, 450, 550])
def test_the_next_transactions_fail_with_the_chosen_code(mail: MailServers, code: int) -> None:
    employee, customer = mail.new_user("employee"), mail.new_user("customer")
    mail.fail_next(2, code)

    for _ in range(2):
        with pytest.raises(smtplib.SMTPDataError) as refused:
            send(mail, employee, outgoing(employee, customer))
        assert refused.value.smtp_code == code
    send(mail, employee, outgoing(employee, customer, "third try"))

    assert [s.subject for s in mail.messages(customer)] == ["third try"]
    assert [a.message.get("Subject") for a in mail.accepted(customer)] == ["third try"]


def test_faults_at_mail_and_rcpt(mail: MailServers) -> None:
    employee, customer = mail.new_user("employee"), mail.new_user("customer")
    mail.fail_next(1, 421, stage="MAIL")
    mail.fail_next(1, 450, stage="RCPT")

    with pytest.raises(smtplib.SMTPSenderRefused) as at_mail:
        send(mail, employee, outgoing(employee, customer))
    assert at_mail.value.smtp_code == 421
    with pytest.raises(smtplib.SMTPRecipientsRefused) as at_rcpt:
        send(mail, employee, outgoing(employee, customer))
    assert at_rcpt.value.recipients[customer.address][0] == 450
    assert mail.messages(customer) == [] and mail.accepted(customer) == []


def test_a_421_closes_the_connection(mail: MailServers) -> None:
    employee, customer = mail.new_user("employee"), mail.new_user("customer")
    mail.fail_next(1, 421)
    with smtplib.SMTP(mail.host, mail.smtp_port, timeout=10) as client:
        client.login(employee.address, employee.password)
        client.mail(employee.address)
        client.rcpt(customer.address)
        code, _ = client.data(outgoing(employee, customer).as_bytes())
        assert code == 421
        with pytest.raises(smtplib.SMTPServerDisconnected):
            client.noop()


def test_a_reply_dropped_after_data_leaves_the_mail_delivered(mail: MailServers) -> None:
    employee, customer = mail.new_user("employee"), mail.new_user("customer")
    message = outgoing(employee, customer)
    mail.drop_after_data()

    with pytest.raises(smtplib.SMTPServerDisconnected):
        send(mail, employee, message)

    assert [s.message_id for s in mail.messages(customer)] == [message["Message-ID"]]
    [accepted] = mail.accepted(customer)
    assert accepted.reply_dropped and accepted.message_id == message["Message-ID"]
    with mail.imap(employee) as client:
        client.select("Sent")
        assert len(uids(client, "HEADER", "Message-ID", message["Message-ID"])) == 1


def test_unknown_recipients_and_wrong_passwords_are_refused(mail: MailServers) -> None:
    employee = mail.new_user("employee")
    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        send(mail, employee, outgoing(employee, MailUser("nobody@example.test", "-")))
    assert refused.value.recipients["nobody@example.test"][0] == 550
    with (
        smtplib.SMTP(mail.host, mail.smtp_port, timeout=10) as client,
        pytest.raises(smtplib.SMTPAuthenticationError),
    ):
        client.login(employee.address, "wrong")
    with pytest.raises(imaplib.IMAP4.error):
        mail.imap(MailUser(employee.address, "wrong"))


def test_a_malformed_mail_is_taken_and_stored_byte_for_byte(mail: MailServers) -> None:
    employee, customer = mail.new_user("employee"), mail.new_user("customer")
    raw = b"Subject: =?bogus?q?\xff\xfe?=\r\nno colon in this header\r\n\r\n\xffbody\r\n"
    with smtplib.SMTP(mail.host, mail.smtp_port, timeout=10) as client:
        client.sendmail(customer.address, [employee.address], raw)
    uid = mail.imap_append(employee, raw)

    stored = mail.messages(employee)
    assert [s.content for s in stored] == [raw, raw]
    assert stored[1].uid == uid
    assert [s.message_id for s in stored] == [None, None]
    [accepted] = mail.accepted(employee)
    assert accepted.message_id is None and accepted.auth_login is None


def test_idle_reports_a_delivery(mail: MailServers) -> None:
    employee, customer = mail.new_user("employee"), mail.new_user("customer")
    with mail.imap(employee) as client:
        status, capability = client.capability()  # after LOGIN: the pre-login list has no IDLE
        assert status == "OK" and b"IDLE" in capability[0].split()
        client.select("INBOX")
        client.send(b"I1 IDLE\r\n")
        assert client.readline().startswith(b"+")  # the socket's 10 s timeout is the deadline

        send(mail, customer, outgoing(customer, employee))

        assert client.readline().strip() == b"* 1 EXISTS"
        client.send(b"DONE\r\n")
        while not (line := client.readline()).startswith(b"I1 "):
            assert line.startswith(b"* "), line
        assert line.startswith(b"I1 OK"), line


def test_stop_ends_connections_and_the_thread() -> None:
    servers = MailServers()
    servers.start()
    user = servers.new_user()
    imap = servers.imap(user)
    smtp = smtplib.SMTP(servers.host, servers.smtp_port, timeout=10)
    smtp.ehlo()

    servers.stop()

    assert not servers.running
    with pytest.raises((imaplib.IMAP4.abort, OSError)):
        imap.noop()
    with pytest.raises((smtplib.SMTPServerDisconnected, OSError)):
        smtp.noop()
    for port in (servers.imap_port, servers.smtp_port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((servers.host, port), timeout=5).close()
    imap.shutdown()
    smtp.close()
