"""The claim comparison of tool JSON results (:mod:`openclaw_rl.judge.claims`) on a corpus of
realistic (response, result) pairs written for it: results that agree with what the agent said must
not be called contradictions (a false -1 on a successful action is the costly error), and results
that contradict it — a time, date, seat, amount, count, recipient, state or flag — must be."""

from __future__ import annotations

import json

import pytest

from openclaw_rl.judge.claims import agreements, contradictions
from openclaw_rl.judge.evidence import read_evidence

CONSISTENT = [
    (
        "Your seat is 14C on flight BA 287, departing 09:40 from gate B12.",
        {
            "status": "confirmed",
            "seat": "14C",
            "flight": "BA287",
            "gate": "B12",
            "departure": "2024-07-02T09:40:00",
        },
    ),
    ("Paid €25.00 to Lena.", {"status": "succeeded", "amount": 2500, "currency": "eur", "to": "Lena Vogel"}),
    ("I've set an alarm for 6:30am.", {"alarm_id": 7, "time": "06:30", "enabled": True}),
    (
        "Done — your dentist appointment with Dr. Ada Okafor is on Friday, June 7 at 2:15pm.",
        {"ok": True, "doctor": "Dr. Ada Okafor", "start": "2024-06-07T14:15:00"},
    ),
    ("Renamed the file to budget_2024.xlsx.", {"ok": True, "old": "budget.xlsx", "new": "budget_2024.xlsx"}),
    ("I turned off the living room lights.", {"device": "living_room_lights", "state": "off"}),
    ("Deleted 3 old drafts.", {"deleted": 3}),
    (
        "Your package is out for delivery and should arrive by 8pm.",
        {"tracking": "1Z999", "status": "out_for_delivery", "eta": "20:00"},
    ),
    (
        "Booked 2 nights at Hotel Aurora, check-in May 3.",
        {"confirmation": "HA-5521", "nights": 2, "check_in": "2024-05-03", "guests": 2},
    ),
    (
        "Room 512 is reserved for you from 3pm to 4pm.",
        {"room": "512", "start": "15:00", "end": "16:00", "status": "reserved"},
    ),
    ("I've unsubscribed you from the newsletter.", {"list": "newsletter", "subscribed": False}),
    (
        "Your account ending in 4421 was charged $12.99.",
        {"charged": True, "account": "****4421", "amount": 12.99, "currency": "USD"},
    ),
    (
        "Sent the agenda to team@acme.io and cc'd you.",
        {"sent": True, "to": ["team@acme.io"], "cc": ["me@acme.io"]},
    ),
    ("The meeting is now on Thursday at 11.", {"event_id": "e9", "start": "2024-05-16T11:00:00"}),
    (
        "I found 4 flights under $300.",
        {"results": [{"flight": "UA12", "price": 289}, {"flight": "DL4", "price": 250}], "count": 4},
    ),
    (
        "Created the issue and assigned it to Priya.",
        {"id": 1182, "title": "Crash on save", "assignee": "priya", "state": "open"},
    ),
    (
        "Your reminder to call mom is set for 18:00 tomorrow.",
        {"id": "rem_2", "at": "2024-05-15T18:00:00", "text": "call mom"},
    ),
    (
        "I added eggs and flour to your shopping list.",
        {"list": "shopping", "added": ["eggs", "flour"], "failed": []},
    ),
    ("Closed ticket #4471.", {"ticket": 4471, "status": "closed"}),
    (
        "Your order #88123 was placed; total €43.50.",
        {"order_id": 88123, "total": 43.5, "currency": "EUR", "status": "placed"},
    ),
    (
        "Scheduled the backup for every night at 2am.",
        {"job": "backup", "cron": "0 2 * * *", "next_run": "2024-05-15T02:00:00"},
    ),
    (
        "Saved the cleaned data to out/clean.csv (1,204 rows).",
        {"ok": True, "path": "out/clean.csv", "rows_written": 1204},
    ),
    ("Converted 100 USD to 92.40 EUR.", {"from": "USD", "to": "EUR", "amount": 92.4}),
    (
        "Ich habe den Termin für Dienstag, 14. Mai um 10 Uhr eingetragen.",
        {"ok": True, "start": "2024-05-14T10:00:00"},
    ),
    (
        "已经帮你订好了5月20日晚上7点的两人位。",
        {"status": "confirmed", "date": "2024-05-20", "time": "19:00", "party_size": 2},
    ),
    ("6月3日の午前10時で予約しました。", {"status": "ok", "start": "2024-06-03T10:00:00"}),
    ("He reservado una mesa para 4 a las 21:00.", {"status": "ok", "party_size": 4, "time": "21:00"}),
    ("J'ai programmé l'envoi pour lundi à 8h.", {"scheduled": True, "send_at": "2024-05-13T08:00:00"}),
    (
        "The deployment to production finished; version 2.4.1 is live.",
        {"status": "success", "version": "2.4.1", "env": "production"},
    ),
    (
        "I've paused your subscription until June.",
        {"subscription": "gym", "status": "paused", "resume": "2024-06-01"},
    ),
    (
        "I've booked your haircut with Sam on Saturday at 11:30.",
        {
            "booking_id": "hc_77",
            "stylist": "Sam",
            "start": "2024-05-18T11:30:00",
            "duration_min": 45,
            "status": "confirmed",
        },
    ),
    (
        "Your Uber is on the way — Toyota Prius, plate 7ABC123, arriving in 4 minutes.",
        {
            "ride_id": "r_1",
            "status": "driver_assigned",
            "car": "Toyota Prius",
            "plate": "7ABC123",
            "eta_min": 4,
        },
    ),
    (
        "Done! I sent $40 to Jamie via Venmo for dinner.",
        {"status": "completed", "amount": 40, "recipient": "@jamie-k", "note": "dinner"},
    ),
    (
        "Added 'Dentist' to your calendar for Tuesday 9–10am.",
        {"event_id": "ev1", "title": "Dentist", "start": "2024-05-14T09:00:00", "end": "2024-05-14T10:00:00"},
    ),
    (
        "I've muted the #random channel for 8 hours.",
        {"ok": True, "channel": "random", "muted_until": "2024-05-14T22:00:00Z"},
    ),
    (
        "Playing 'Blue in Green' by Miles Davis on the kitchen speaker.",
        {"status": "playing", "track": "Blue in Green", "artist": "Miles Davis", "device": "Kitchen"},
    ),
    ("The thermostat is now set to 21°C.", {"ok": True, "target_c": 21, "mode": "heat"}),
    (
        "Your 2 tickets for Dune on Friday at 7:45pm are confirmed: seats F7 and F8.",
        {
            "status": "confirmed",
            "movie": "Dune",
            "seats": ["F7", "F8"],
            "showtime": "2024-05-17T19:45:00",
            "quantity": 2,
        },
    ),
    ("I updated the spreadsheet: 12 rows changed.", {"ok": True, "sheet": "Q2", "updated_rows": 12}),
    (
        "Your password was reset; a confirmation email went to j***@gmail.com.",
        {"status": "ok", "sent_to": "j***@gmail.com"},
    ),
    (
        "The file is uploaded: https://files.acme.io/d/abc/report.pdf",
        {"ok": True, "url": "https://files.acme.io/d/abc/report.pdf", "size": 120334},
    ),
    (
        "Created a new branch called fix-login from main.",
        {"ref": "refs/heads/fix-login", "object": {"sha": "ab12cd"}},
    ),
    (
        "I merged PR #42 into main.",
        {"merged": True, "sha": "9f8e7d", "message": "Pull Request successfully merged"},
    ),
    (
        "Translated to French: « Bonjour à tous ».",
        {"translation": "Bonjour à tous", "source": "en", "target": "fr"},
    ),
    (
        "It's 18°C and cloudy in Berlin right now.",
        {"city": "Berlin", "temp_c": 18, "conditions": "cloudy", "updated_at": "2024-05-14T13:00:00Z"},
    ),
    (
        "Your next bus, line 42, leaves at 14:05 from stop Hauptbahnhof.",
        {"line": "42", "departure": "14:05", "stop": "Hauptbahnhof"},
    ),
    (
        "Booked a double room at Hotel Sol for 3 nights, May 10–13, €360 total.",
        {
            "status": "confirmed",
            "room_type": "double",
            "nights": 3,
            "check_in": "2024-05-10",
            "check_out": "2024-05-13",
            "total": 360,
            "currency": "EUR",
        },
    ),
    (
        "Ordered 2 large pepperoni pizzas, arriving around 8:30pm.",
        {
            "order_id": 5521,
            "items": [{"name": "pepperoni", "size": "large", "qty": 2}],
            "eta": "20:30",
            "status": "placed",
        },
    ),
    ("I removed Tom from the project.", {"ok": True, "removed": ["tom@acme.io"]}),
    ("Invited Ana and Luis to the standup.", {"ok": True, "invited": ["ana@acme.io", "luis@acme.io"]}),
    (
        "Set your out-of-office from June 3 to June 7.",
        {"enabled": True, "start": "2024-06-03", "end": "2024-06-07"},
    ),
    (
        "The shipment to Madrid left the warehouse this morning.",
        {"status": "in_transit", "destination": "Madrid, ES", "last_scan": "2024-05-14T07:12:00"},
    ),
    ("I archived 15 old emails from the newsletter folder.", {"archived": 15, "folder": "newsletter"}),
    (
        "Your flight UA 900 to Frankfurt departs at 5:55pm from gate C7.",
        {"flight": "UA900", "destination": "FRA", "departure": "2024-05-20T17:55:00", "gate": "C7"},
    ),
    ("Added milk to the shopping list (now 5 items).", {"list": "shopping", "added": ["milk"], "items": 5}),
    (
        "I cancelled the 3pm meeting and told the attendees.",
        {"event_id": "e2", "status": "cancelled", "notified": 3},
    ),
    (
        "Created invoice INV-2024-0042 for $1,250.00, due June 1.",
        {
            "invoice": "INV-2024-0042",
            "amount": 1250.0,
            "currency": "USD",
            "due": "2024-06-01",
            "status": "draft",
        },
    ),
    (
        "Your reservation at Osteria Nonna for 4 people tonight at 8 is confirmed.",
        {"restaurant": "Osteria Nonna", "party_size": 4, "time": "20:00", "status": "confirmed"},
    ),
    (
        "I've set the lights in the bedroom to 30% brightness.",
        {"device": "bedroom", "brightness": 30, "on": True},
    ),
    ("Turned on the porch light.", {"device": "porch", "state": "on"}),
    (
        "Scheduled the email to Priya for Monday at 9am.",
        {"scheduled": True, "to": "priya@acme.io", "send_at": "2024-05-20T09:00:00"},
    ),
    ("已将会议改到周四下午两点。", {"ok": True, "start": "2024-05-16T14:00:00"}),
    ("Ich habe 3 Tickets für Samstag gebucht.", {"status": "confirmed", "quantity": 3, "date": "2024-05-18"}),
    ("He enviado el informe a Marta.", {"sent": True, "to": "marta.ruiz@empresa.es"}),
    ("明日の10時にリマインダーを設定しました。", {"id": "r9", "at": "2024-05-15T10:00:00"}),
    (
        "C'est fait : virement de 150 € vers le compte de Julie.",
        {"status": "completed", "amount": 150, "currency": "EUR", "to": "Julie Martin"},
    ),
    ("Reminder set: take meds at 8 tonight.", {"id": "r", "at": "2024-05-14T20:00:00"}),
    ("Booked for 9:30.", {"status": "ok", "time": "09:30"}),
    (
        "You're booked 2–3pm on Wed, May 15.",
        {"status": "ok", "start": "2024-05-15T14:00:00", "end": "2024-05-15T15:00:00"},
    ),
    ("The call is at 3pm London time (10am in New York).", {"start": "2024-05-15T15:00:00+01:00"}),
    ("Set an alarm for 7.", {"alarm": "07:00", "enabled": True}),
    (
        "Your delivery window is 10am–12pm tomorrow.",
        {"window_start": "10:00", "window_end": "12:00", "date": "2024-05-15"},
    ),
    (
        "Lunch with Kim is on the calendar for 12:30 on Thursday.",
        {"title": "Lunch with Kim", "start": "2024-05-16T12:30:00"},
    ),
    (
        "Done — the cron job now runs daily at midnight.",
        {"schedule": "0 0 * * *", "next_run": "2024-05-15T00:00:00", "frequency": "daily"},
    ),
    (
        "The store closes at 9pm today; I placed a pickup order for 6pm.",
        {"order": "p1", "pickup": "18:00", "status": "placed"},
    ),
    (
        "I've blocked 1–2pm every Friday for focus time.",
        {
            "event_id": "f1",
            "start": "2024-05-17T13:00:00",
            "end": "2024-05-17T14:00:00",
            "recurrence": "weekly",
        },
    ),
    (
        "Your subscription renews on June 1 for $9.99.",
        {"status": "active", "renews": "2024-06-01", "price": 9.99},
    ),
    (
        "I cancelled the order; the refund of $23.50 will arrive in 3–5 days.",
        {"status": "cancelled", "refund": 23.5},
    ),
    ("The meeting was moved from Tuesday to Wednesday.", {"ok": True, "start": "2024-05-15T10:00:00"}),
    (
        "Sent the contract to legal@acme.io; Dana is cc'd.",
        {"sent": True, "to": ["legal@acme.io"], "cc": ["dana@acme.io"]},
    ),
    ("Disabled two-factor authentication as requested.", {"mfa_enabled": False}),
    ("Enabled dark mode.", {"theme": "dark", "ok": True}),
    (
        "Your dog walker Alex is booked for Mon, Wed and Fri at 7am.",
        {"walker": "Alex", "days": ["Mon", "Wed", "Fri"], "time": "07:00"},
    ),
    ("Table for two at 7:30 tomorrow.", {"party_size": 2, "time": "19:30", "date": "2024-05-15"}),
    ("I've paid the electricity bill: $84.20.", {"status": "paid", "amount_cents": 8420}),
    ("Copied 3 files to the backup drive.", {"copied": ["a.txt", "b.txt", "c.txt"], "dest": "/mnt/backup"}),
    ("Deleted the draft.", {"deleted": True, "id": "d1"}),
    ("Archived the project.", {"project": "apollo", "status": "archived"}),
    (
        "The release v2.1.0 is published on GitHub.",
        {"tag_name": "v2.1.0", "draft": False, "published_at": "2024-05-14T10:11:12Z"},
    ),
    ("I've turned the heating down to 18 degrees.", {"target": 18, "unit": "celsius"}),
    ("Started a 25-minute timer.", {"timer_id": 1, "duration_s": 1500, "state": "running"}),
    ("Stopped the timer at 12:34.", {"timer_id": 1, "state": "stopped", "elapsed": "12:34"}),
    (
        "The doc is shared with view access for everyone at the company.",
        {"ok": True, "role": "reader", "type": "domain"},
    ),
    (
        "Ordered a medium latte for pickup at the Main St store.",
        {"order": "c1", "item": "latte", "size": "medium", "store": "Main St"},
    ),
    (
        "Your train to Lyon leaves from platform 4 at 10:12.",
        {"train": "TGV 6601", "destination": "Lyon Part-Dieu", "platform": "4", "departure": "10:12"},
    ),
    (
        "Checked you in; your seat is 23A and boarding starts at 6:10am.",
        {"checked_in": True, "seat": "23A", "boarding": "06:10"},
    ),
]

CONTRADICTED = [
    ("Your seat is 14C.", {"status": "confirmed", "seat": "21A"}),
    ("You're on flight BA 287.", {"status": "confirmed", "flight": "BA 297"}),
    ("Room 512 is yours from 3pm.", {"room": "215", "start": "15:00", "status": "reserved"}),
    ("Booked with Dr. Shah for Friday.", {"ok": True, "doctor": "Okafor", "start": "2024-06-07T14:15:00"}),
    ("Your confirmation number is NN-2291.", {"status": "ok", "confirmation": "NN-2292"}),
    ("Charged the card ending in 4421.", {"charged": True, "card": "****1244"}),
    ("I turned off the living room lights.", {"device": "living_room_lights", "state": "on"}),
    ("Done, I've set the alarm for 6:30am.", {"alarm_id": 7, "time": "18:30", "enabled": True}),
    ("Sent!", {"sent": False, "reason": "recipient blocked"}),
    ("Booked 2 nights at Hotel Aurora.", {"confirmation": "HA-5521", "nights": 3}),
    ("He reservado una mesa para 4 a las 21:00.", {"status": "ok", "party_size": 4, "time": "20:00"}),
    ("已经帮你订好了5月20日的位子。", {"status": "confirmed", "date": "2024-05-21"}),
    ("I've unsubscribed you from the newsletter.", {"list": "newsletter", "subscribed": True}),
    ("Published the post.", {"status": "draft", "id": 55}),
    (
        "I've booked your haircut with Sam on Saturday at 11:30.",
        {"booking_id": "hc_77", "stylist": "Sam", "start": "2024-05-18T12:30:00", "status": "confirmed"},
    ),
    ("Done! I sent $40 to Jamie.", {"status": "completed", "amount": 4, "recipient": "@jamie-k"}),
    (
        "Added 'Dentist' to your calendar for Tuesday 9–10am.",
        {"event_id": "ev1", "title": "Dentist", "start": "2024-05-15T09:00:00"},
    ),
    ("The thermostat is now set to 21°C.", {"ok": True, "target_c": 12, "mode": "heat"}),
    (
        "Your 2 tickets for Dune on Friday are confirmed.",
        {"status": "confirmed", "movie": "Dune", "quantity": 1, "showtime": "2024-05-17T19:45:00"},
    ),
    ("I merged PR #42 into main.", {"merged": False, "message": "Merge conflict"}),
    (
        "Translated to French.",
        {"translation": "Hallo zusammen", "source": "en", "target": "de", "language": "german"},
    ),
    (
        "Booked a double room at Hotel Sol for 3 nights from May 10.",
        {"status": "confirmed", "nights": 2, "check_in": "2024-05-10"},
    ),
    ("I removed Tom from the project.", {"ok": True, "removed": []}),
    (
        "Set your out-of-office from June 3 to June 7.",
        {"enabled": False, "start": "2024-06-03", "end": "2024-06-07"},
    ),
    (
        "Your flight UA 900 departs at 5:55pm from gate C7.",
        {"flight": "UA900", "departure": "2024-05-20T17:55:00", "gate": "C9"},
    ),
    (
        "I cancelled the 3pm meeting.",
        {"event_id": "e2", "status": "confirmed", "start": "2024-05-14T15:00:00"},
    ),
    ("Created invoice for $1,250.00.", {"invoice": "INV-2024-0042", "amount": 125.0, "currency": "USD"}),
    (
        "Scheduled the email to Priya for Monday at 9am.",
        {"scheduled": True, "to": "pedro@acme.io", "send_at": "2024-05-20T09:00:00"},
    ),
    ("已将会议改到周四下午两点。", {"ok": True, "start": "2024-05-16T15:00:00"}),
    ("Ich habe 3 Tickets für Samstag gebucht.", {"status": "confirmed", "quantity": 2, "date": "2024-05-18"}),
    ("明日の10時にリマインダーを設定しました。", {"id": "r9", "at": "2024-05-15T11:00:00"}),
    (
        "C'est fait : virement de 150 € vers le compte de Julie.",
        {"status": "completed", "amount": 15, "currency": "EUR"},
    ),
    ("Checked you in; your seat is 23A.", {"checked_in": True, "seat": "32A"}),
    ("Disabled two-factor authentication.", {"mfa_enabled": True}),
    # another record than the one the response names
    ("I'll fetch the user with id 42.", {"user": {"id": 17, "name": "Bob"}}),
    ("Closing issue 118.", {"id": 119, "state": "closed"}),
    ("Looking up ticket PROJ-221.", {"id": "PROJ-212", "summary": "Export button greyed out"}),
    ("Refunding order #5521 now.", {"order_id": 5512, "refunded": True}),
    # said it would write, wrote nothing; a count of failed parts beside a success
    (
        "I'll write the meeting summary to notes.md.",
        {"ok": True, "path": "/home/u/notes.md", "bytes_written": 0},
    ),
    ("Sent the invite to all six of you.", {"status": "confirmed", "invites_failed": 5}),
]


@pytest.mark.parametrize("response, result", CONSISTENT, ids=[r[:40] for r, _ in CONSISTENT])
def test_results_that_agree_are_not_contradictions(response, result):
    assert contradictions(response, result) == []
    assert read_evidence("tool", json.dumps(result), response).score != -1


@pytest.mark.parametrize("response, result", CONTRADICTED, ids=[r[:40] for r, _ in CONTRADICTED])
def test_results_that_contradict_the_response_are_negative(response, result):
    ev = read_evidence("tool", json.dumps(result), response)
    assert ev.score == -1, ev.reason


RECORDS_THAT_MATCH = [
    ("Fetching user 42.", {"user": {"id": 42, "name": "Bob"}}),
    ("Closing issue 118.", {"id": 118, "state": "closed"}),
    # a create returns the new record's own id; the order it is about is another field
    ("Creating a ticket for order 5521.", {"id": 900, "order_id": 5521}),
    ("Opening a PR for issue 77.", {"id": 1203, "number": 1203, "title": "Fix #77"}),
    # numbers that are no record's number
    ("I charged the customer 42 dollars.", {"customer": {"id": 7}, "charged": 42}),
    # a count of failures as the thing asked for is no failure of the action
    ("Fetching the security report.", {"status": "ok", "failed_logins": 3}),
    ("Moved the meeting for project 12 to 3pm.", {"ok": True, "start": "2024-05-14T15:00:00", "project": 12}),
]


@pytest.mark.parametrize("response, result", RECORDS_THAT_MATCH, ids=[r[:40] for r, _ in RECORDS_THAT_MATCH])
def test_a_result_about_the_record_the_response_names_is_no_contradiction(response, result):
    assert contradictions(response, result) == []


def test_the_record_and_the_quoted_text_the_response_named_count_as_confirmation():
    """A result that echoes the record or the quoted title is positive evidence, even when the
    title itself reads like a failure."""
    assert agreements("Fetching order 5521.", {"id": 5521, "status": "shipped"}) == ["record"]
    created = {"id": 4812, "title": "Login fails on Safari", "state": "open"}
    response = "Creating the GitHub issue titled 'Login fails on Safari'."
    assert agreements(response, created) == ["quoted text"]
    assert read_evidence("tool", json.dumps(created), response).score == 1
    # quoting is not enough when the result also reports a failure
    failed = {"ok": False, "error": "rate limited", "title": "Login fails on Safari"}
    assert read_evidence("tool", json.dumps(failed), response).score != 1
