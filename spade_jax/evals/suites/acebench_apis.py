"""The simulated APIs of ACEBench's agent categories: a phone (BaseApi, MessageApi, ReminderApi,
FoodPlatform) and an airline (Travel), written here from the function schemas, initial and end
states of the data and the behaviour of upstream's classes (read, not copied).

The starting records (six users and their messages, three reminders, six food merchants and
their menus, three airline users, eleven flights, four reservations) are the benchmark's
published scenario, transcribed from upstream's classes: every item starts from them; an item's
``initial_config`` sets the phone's ``wifi`` and ``logged_in`` (each class loads its own entry,
then the ``BaseApi`` one, as upstream does). An item's end state is compared on
`SAVED_ATTRIBUTES`.

Upstream's behaviour is kept where it shows in an end state or a reply, quirks included: every
phone class has its own Wi-Fi and login (a call of ``turn_on_wifi`` reaches all of them, see
`Scenario.run`); a sent message has no time, so the latest/earliest-message calls fail once one
is sent; cancelling a reservation refunds the ticket to the cash balance and keeps the
reservation; a cabin change is priced on the reservation's old flight. ``search_reminders`` is
in the schemas but not in upstream's classes, so calling it fails there and here.

A call reaches only the public methods below with keyword arguments that are literals parsed
from the reply (never model code); any exception it raises becomes the call's result text,
``Error during execution: ...``, as upstream reports it.
"""

from __future__ import annotations

import copy
import datetime
import inspect
import json
from typing import Any

PHONE_USERS = {
    "Eve": {"user_id": "USR100", "phone_number": "123-456-7890", "occupation": "Software Engineer"},
    "Frank": {"user_id": "USR101", "phone_number": "234-567-8901", "occupation": "Data Scientist"},
    "Grace": {"user_id": "USR102", "phone_number": "345-678-9012", "occupation": "Product Manager"},
    "Helen": {"user_id": "USR103", "phone_number": "456-789-0123", "occupation": "UX Designer"},
    "Isaac": {"user_id": "USR104", "phone_number": "567-890-1234", "occupation": "DevOps Engineer"},
    "Jack": {"user_id": "USR105", "phone_number": "678-901-2345", "occupation": "Marketing Specialist"},
}
INBOX = {
    1: {"sender_id": "USR100", "receiver_id": "USR101",
        "message": "Hey Frank, don't forget about our meeting on 2024-06-11 at 4 PM in Conference Room 1.",
        "time": "2024-06-09"},
    2: {"sender_id": "USR101", "receiver_id": "USR102",
        "message": "Can you help me order a \"Margherita Pizza\" delivery? The merchant is Domino's.",
        "time": "2024-03-09"},
    3: {"sender_id": "USR102", "receiver_id": "USR103",
        "message": "Please check the milk tea delivery options available from Heytea and purchase a cheaper milk tea "
                   "for me. After making the purchase, remember to reply to me with \"Already bought.\"",
        "time": "2023-12-05"},
    4: {"sender_id": "USR103", "receiver_id": "USR102", "message": "No problem Helen, I can assist you.",
        "time": "2024-09-09"},
    5: {"sender_id": "USR104", "receiver_id": "USR105", "message": "Isaac, are you available for a call?",
        "time": "2024-06-06"},
    6: {"sender_id": "USR105", "receiver_id": "USR104", "message": "Yes Jack, let's do it in 30 minutes.",
        "time": "2024-01-15"},
}
REMINDERS = {
    1: {"reminder_id": 1001, "title": "Doctor's Appointment", "description": "Visit Dr. Smith for a checkup.",
        "time": "2024-07-15 09:30", "notified": False},
    2: {"reminder_id": 1002, "title": "Team Meeting", "description": "Monthly project review with the team.",
        "time": "2024-07-17 11:00", "notified": False},
    3: {"reminder_id": 1003, "title": "To-do list",
        "description": "First, help Frank place a food delivery order at \"Hema Fresh,\" ordering two \"Fresh Gift "
                       "Packs.\" Then, send a message to Frank saying, \"The price of the purchased goods is () yuan.\" "
                       "Replace the parentheses with the actual amount, keeping one decimal place.",
        "time": "2024-07-16 11:00", "notified": False},
}
FOOD_USERS = {
    "Eve": {"user_id": "U100", "password": "password123", "balance": 500.0},
    "Frank": {"user_id": "U101", "password": "password456", "balance": 300.0},
    "Grace": {"user_id": "U102", "password": "password789", "balance": 150.0},
    "Helen": {"user_id": "U103", "password": "password321", "balance": 800.0},
    "Isaac": {"user_id": "U104", "password": "password654", "balance": 400.0},
    "Jack": {"user_id": "U105", "password": "password654", "balance": 120.0},
}
MERCHANTS = {
    "Domino's": {"merchant_id": "M100", "service_type": "Pizza", "menu": [
        {"product": "Margherita Pizza", "price": 68.0}, {"product": "Super Supreme Pizza", "price": 88.0}]},
    "Rice Village Bibimbap": {"merchant_id": "M101", "service_type": "Bibimbap", "menu": [
        {"product": "Stone Pot Bibimbap", "price": 35.0}, {"product": "Korean Beef Bibimbap", "price": 45.0}]},
    "Haidilao": {"merchant_id": "M102", "service_type": "Hotpot", "menu": [
        {"product": "Beef Rolls", "price": 68.0}, {"product": "Seafood Platter", "price": 88.0}]},
    "Heytea": {"merchant_id": "M103", "service_type": "Milk Tea", "menu": [
        {"product": "Cheese Milk Tea", "price": 25.0}, {"product": "Four Seasons Spring Milk Tea", "price": 22.0}]},
    "Hema Fresh": {"merchant_id": "M104", "service_type": "Fresh Grocery", "menu": [
        {"product": "Organic Vegetable Pack", "price": 15.0}, {"product": "Fresh Gift Pack", "price": 99.0}]},
    "Jiutian BBQ": {"merchant_id": "M105", "service_type": "BBQ", "menu": [
        {"product": "Korean Grilled Beef", "price": 128.0}, {"product": "Grilled Pork Belly", "price": 78.0}]},
}
TRAVEL_USERS = {
    "user1": {"user_name": "Eve", "password": "password123", "cash_balance": 2000.0, "bank_balance": 50000.0,
              "membership_level": "regular"},
    "user2": {"user_name": "Frank", "password": "password456", "cash_balance": 8000.0, "bank_balance": 8000.0,
              "membership_level": "silver"},
    "user3": {"user_name": "Grace", "password": "password789", "cash_balance": 1000.0, "bank_balance": 5000.0,
              "membership_level": "gold"},
}
# flight_no, origin, destination, departure, arrival, seats, economy price, business price
_FLIGHTS = [
    ("CA1234", "Beijing", "Shanghai", "2024-07-15 08:00:00", "2024-07-15 10:30:00", 5, 1200, 3000),
    ("MU5678", "Shanghai", "Beijing", "2024-07-16 09:00:00", "2024-07-16 11:30:00", 3, 1900, 3000),
    ("CZ4321", "Shanghai", "Beijing", "2024-07-16 20:00:00", "2024-07-16 22:00:00", 8, 2500, 4000),
    ("CZ4352", "Shanghai", "Beijing", "2024-07-17 20:00:00", "2024-07-17 22:00:00", 8, 1600, 2500),
    ("MU3561", "Beijing", "Nanjing", "2024-07-18 08:00:00", "2024-07-18 10:00:00", 8, 1500, 4000),
    ("MU1566", "Beijing", "Nanjing", "2024-07-18 20:00:00", "2024-07-18 22:00:00", 8, 1500, 4000),
    ("CZ1765", "Nanjing", "Shenzhen", "2024-07-17 20:30:00", "2024-07-17 22:00:00", 8, 1500, 2500),
    ("CZ1765", "Nanjing", "Shenzhen", "2024-07-18 12:30:00", "2024-07-18 15:00:00", 8, 1500, 2500),
    ("MH1765", "Xiamen", "Chengdu", "2024-07-17 12:30:00", "2024-07-17 15:00:00", 8, 1500, 2500),
    ("MH2616", "Chengdu", "Xiamen", "2024-07-18 18:30:00", "2024-07-18 21:00:00", 8, 1500, 2500),
    ("MH2616", "Chengdu", "Fuzhou", "2024-07-16 18:30:00", "2024-07-16 21:00:00", 8, 1500, 2500),
]
FLIGHTS = [{"flight_no": no, "origin": origin, "destination": destination, "depart_time": depart,
            "arrival_time": arrive, "status": "available", "seats_available": seats, "economy_price": economy,
            "business_price": business}
           for no, origin, destination, depart, arrive, seats, economy, business in _FLIGHTS]
RESERVATIONS = [
    {"reservation_id": "res_1", "user_id": "user1", "flight_no": "CA1234", "payment_method": "bank",
     "cabin": "Economy Class", "baggage": 1, "origin": "Beijing", "destination": "Shanghai"},
    {"reservation_id": "res_2", "user_id": "user1", "flight_no": "MU5678", "payment_method": "bank",
     "cabin": "Business Class", "baggage": 1, "origin": "Shanghai", "destination": "Beijing"},
    {"reservation_id": "res_3", "user_id": "user2", "flight_no": "MH1765", "payment_method": "bank",
     "cabin": "Business Class", "baggage": 1, "origin": "Xiamen", "destination": "Chengdu"},
    {"reservation_id": "res_4", "user_id": "user2", "flight_no": "MU2616", "payment_method": "bank",
     "cabin": "Business Class", "baggage": 1, "origin": "Chengdu", "destination": "Xiamen"},
]
FREE_BAGS = {"regular": {"Economy Class": 1, "Business Class": 2}, "silver": {"Economy Class": 2, "Business Class": 3},
             "gold": {"Economy Class": 3, "Business Class": 3}}
BAG_FEE = 50
TRAVEL_NOW = datetime.datetime(2024, 7, 14, 6, 0, 0)  # the clock cancellations are judged by
AIRLINE_CANCELLED = "The airline has canceled the flight."
MESSAGE_CAPACITY = REMINDER_CAPACITY = 6


def _status(ok: bool, message: str) -> dict:
    return {"status": ok, "message": message}


class BaseApi:
    """The phone itself: Wi-Fi (off unless the item says on) and the device login."""

    def __init__(self):
        self.wifi = False
        self.logged_in = True

    def _load_scenario(self, config: dict) -> None:
        self.wifi = config.get("wifi", False)
        self.logged_in = config.get("logged_in", True)

    def turn_on_wifi(self):
        self.wifi = True
        return _status(True, "Wi-Fi has been turned on")

    def login_device(self):
        self.logged_in = True
        return _status(True, "Device has been logged in")


class MessageApi(BaseApi):
    """Text messages between six users; the inbox holds at most six, by id."""

    def __init__(self):
        super().__init__()
        self.user_list = copy.deepcopy(PHONE_USERS)
        self.inbox = copy.deepcopy(INBOX)
        self.message_id_counter = max(INBOX)

    def send_message(self, sender_name, receiver_name, message):
        if not self.logged_in:
            return _status(False, "Device not logged in, unable to send message")
        if not self.wifi:
            return _status(False, "Wi-Fi is turned off, cannot send messages at this time")
        if len(self.inbox) >= MESSAGE_CAPACITY:
            return _status(False, "Inbox capacity is full. You need to ask the user which message to delete.")
        if sender_name not in self.user_list or receiver_name not in self.user_list:
            return _status(False, "Sender or receiver does not exist")
        self.message_id_counter += 1
        self.inbox[self.message_id_counter] = {"sender_id": self.user_list[sender_name]["user_id"],
                                               "receiver_id": self.user_list[receiver_name]["user_id"],
                                               "message": message}
        return _status(True, f"Message successfully sent to {receiver_name}.")

    def delete_message(self, message_id):
        if not self.logged_in:
            return _status(False, "Device not logged in, unable to delete message")
        if message_id not in self.inbox:
            return _status(False, "Message ID does not exist")
        del self.inbox[message_id]
        return _status(True, f"Message ID {message_id} has been successfully deleted.")

    def view_messages_between_users(self, sender_name, receiver_name):
        if not self.logged_in:
            return _status(False, "Device not logged in, unable to view message information")
        if sender_name not in self.user_list:
            return _status(False, "Sender does not exist")
        if receiver_name not in self.user_list:
            return _status(False, "Receiver does not exist")
        sender, receiver = self.user_list[sender_name]["user_id"], self.user_list[receiver_name]["user_id"]
        found = [{"id": key, "sender": sender_name, "receiver": receiver_name, "message": m["message"]}
                 for key, m in self.inbox.items() if m["sender_id"] == sender and m["receiver_id"] == receiver]
        if not found:
            return _status(False, "No related message records found")
        return {"status": True, "messages": found}

    def search_messages(self, user_name, keyword):
        if user_name not in self.user_list:
            return _status(False, "User does not exist")
        user = self.user_list[user_name]["user_id"]
        found = [{"id": key, "sender_id": m["sender_id"], "receiver_id": m["receiver_id"], "message": m["message"]}
                 for key, m in self.inbox.items()
                 if user in (m["sender_id"], m["receiver_id"]) and keyword.lower() in m["message"].lower()]
        if not found:
            return _status(False, "No messages found containing the keyword")
        return {"status": True, "messages": found}

    def get_all_message_times_with_ids(self):
        if not self.logged_in:
            return _status(False, "Device not logged in, unable to retrieve all message times and their "
                                  "corresponding message IDs.")
        return {key: m["time"] for key, m in self.inbox.items()}

    def get_latest_message_id(self):
        return self._extreme_message_id("latest", max)

    def get_earliest_message_id(self):
        return self._extreme_message_id("earliest", min)

    def _extreme_message_id(self, which: str, pick) -> dict:
        if not self.logged_in:
            return _status(False, f"Device not logged in, unable to retrieve the {which} sent message ID.")
        if not self.inbox:
            return _status(False, "No message records found")
        times = {key: datetime.datetime.strptime(m["time"], "%Y-%m-%d") for key, m in self.inbox.items()}
        chosen = pick(times, key=times.__getitem__)  # the first id among equal times, as upstream's scan
        return {"status": True, "message": f"The {which} message ID is {chosen}", "message_id": chosen}


class ReminderApi(BaseApi):
    """Reminders by title; at most six."""

    def __init__(self):
        super().__init__()
        self.reminder_list = copy.deepcopy(REMINDERS)
        self.reminder_id_counter = max(REMINDERS)

    def view_reminder_by_title(self, title):
        if not self.logged_in:
            return _status(False, "The device is not logged in, so you cannot view notifications")
        for reminder in self.reminder_list.values():
            if reminder["title"] == title:
                return {"status": True, "reminder": reminder}
        return _status(False, f"No reminder found with the title '{title}'.")

    def add_reminder(self, title, description, time):
        if not self.logged_in:
            return _status(False, "Device not logged in. Unable to add a new reminder.")
        if len(self.reminder_list) >= REMINDER_CAPACITY:
            return _status(False, "Reminder capacity is full. Unable to add a new reminder.")
        self.reminder_id_counter += 1
        self.reminder_list[self.reminder_id_counter] = {"reminder_id": self.reminder_id_counter, "title": title,
                                                        "description": description, "time": time, "notified": False}
        return _status(True, f"Reminder '{title}' was successfully added.")

    def delete_reminder(self, reminder_id):
        if not self.logged_in:
            return _status(False, "Device not logged in. Unable to delete the specified reminder.")
        if reminder_id not in self.reminder_list:
            return _status(False, "Reminder ID does not exist.")
        del self.reminder_list[reminder_id]
        return _status(True, f"Reminder ID {reminder_id} was successfully deleted.")

    def view_all_reminders(self):
        if not self.reminder_list:
            return _status(False, "No reminders found.")
        return {"status": True, "reminders": [{key: r[key] for key in ("title", "description", "time", "notified")}
                                              for r in self.reminder_list.values()]}


class FoodPlatform(BaseApi):
    """Food delivery: users with balances log in (needs Wi-Fi) and order from six merchants' menus."""

    def __init__(self):
        super().__init__()
        self.users = copy.deepcopy(FOOD_USERS)
        self.merchant_list = copy.deepcopy(MERCHANTS)
        self.logged_in_users = []
        self.orders = []

    def _load_scenario(self, config: dict) -> None:
        super()._load_scenario(config)
        self.logged_in_users = list(config.get("logged_in_users", []))

    def login_food_platform(self, username, password):
        if not self.wifi:
            return _status(False, "Wi-Fi is not enabled, unable to login")
        if username not in self.users:
            return _status(False, "User does not exist")
        if self.users[username]["password"] != password:
            return _status(False, "Incorrect password")
        if username in self.logged_in_users:
            return _status(False, f"{username} is already logged in")
        self.logged_in_users.append(username)
        return _status(True, f"User {username} has successfully logged in!")

    def view_logged_in_users(self):
        if not self.logged_in_users:
            return _status(False, "No users are currently logged in to the food platform")
        return {"status": True, "logged_in_users": self.logged_in_users}

    def check_balance(self, user_name):
        return self.users[user_name]["balance"] if user_name in self.users else 0.0

    def add_food_delivery_order(self, username, merchant_name, items):
        if username not in self.logged_in_users:
            return _status(False, f"User {username} is not logged in to the food platform")
        if merchant_name not in self.merchant_list:
            return _status(False, "Merchant does not exist")
        prices = {}
        for entry in self.merchant_list[merchant_name]["menu"]:
            prices.setdefault(entry["product"], entry["price"])
        total, lines = 0.0, []
        for item in items:
            product, quantity = item.get("product"), item.get("quantity", 1)
            if not isinstance(quantity, int) or quantity <= 0:
                return _status(False, f"Invalid quantity {quantity} for product {product}")
            if product not in prices:
                return _status(False, f"Product {product} does not exist in {merchant_name}'s menu")
            total += prices[product] * quantity
            lines.append({"product": product, "quantity": quantity, "price_per_unit": prices[product]})
        if total > self.users[username]["balance"]:
            return _status(False, "Insufficient balance to place the order")
        self.users[username]["balance"] -= total
        self.orders.append({"user_name": username, "merchant_name": merchant_name, "items": lines,
                            "total_price": total})
        return _status(True, f"Food delivery order successfully placed with {merchant_name}. Total amount: {total} yuan")

    def get_products(self, merchant_name):
        merchant = self.merchant_list.get(merchant_name)
        return merchant["menu"] if merchant else _status(False, f"Merchant '{merchant_name}' does not exist")

    def view_orders(self, user_name):
        mine = [order for order in self.orders if order["user_name"] == user_name]
        return {"status": True, "orders": mine} if mine else _status(False, "User has no order records")

    def search_orders(self, keyword):
        word = keyword.lower()
        found = [order for order in self.orders if word in order["merchant_name"].lower()
                 or any(word in line["product"].lower() for line in order.get("items", []))]
        return {"status": True, "orders": found} if found else _status(False, "No matching orders found")


class Travel:
    """An airline: three users with cash and bank balances, flights, reservations."""

    def __init__(self):
        self.users = copy.deepcopy(TRAVEL_USERS)
        self.flights = copy.deepcopy(FLIGHTS)
        self.reservations = copy.deepcopy(RESERVATIONS)

    def _load_scenario(self, config: dict) -> None:
        """Every travel item starts from the published records."""

    def get_flight_details(self, origin=None, destination=None):
        flights = [f for f in self.flights
                   if (not origin or f["origin"] == origin) and (not destination or f["destination"] == destination)]
        if not flights:
            return "There are no direct flights that meet the criteria."
        return [dict(f) for f in flights]

    def get_user_details(self, user_id, password):
        user = self.users.get(user_id)
        if user and user["password"] == password:
            return {key: value for key, value in user.items() if key != "password"}
        return {"status": "error", "message": "Incorrect username or password."}

    def get_reservation_details(self, reservation_id=None, user_id=None):
        if reservation_id:
            found = [r for r in self.reservations if r["reservation_id"] == reservation_id]
        elif user_id:
            found = [r for r in self.reservations if r["user_id"] == user_id]
        else:
            return {"status": "error", "message": "Please provide a valid reservation ID or user ID"}
        return [{**r, "flight_info": self._flight(r["flight_no"])} for r in found]

    def authenticate_user(self, user_id, password):
        user = self.users.get(user_id)
        if user and user["password"] == password:
            return user
        return {"status": "error", "message": "Incorrect username or password."}

    def get_baggage_allowance(self, membership_level, cabin_class):
        return FREE_BAGS.get(membership_level, {}).get(cabin_class, 0)

    def calculate_baggage_fee(self, membership_level, cabin_class, baggage_count):
        return max(baggage_count - FREE_BAGS[membership_level][cabin_class], 0) * BAG_FEE

    def find_transfer_flights(self, origin_city, transfer_city, destination_city):
        def legs(origin, destination):
            return [f for f in self.flights
                    if f["origin"] == origin and f["destination"] == destination and f["status"] == "available"]

        pairs = [{"first_leg": first, "second_leg": second}
                 for first in legs(origin_city, transfer_city) for second in legs(transfer_city, destination_city)
                 if _time(first["arrival_time"]) < _time(second["depart_time"])]
        return pairs or "No connecting flights that meet the criteria were found."

    def reserve_flight(self, user_id, password, flight_no, cabin, payment_method, baggage_count):
        user = self.authenticate_user(user_id, password)
        flight = next((f for f in self.flights if f["flight_no"] == flight_no and f["status"] == "available"), None)
        if flight is None:
            raise LookupError(f"no available flight {flight_no!r}")
        if "membership_level" not in user:
            raise PermissionError(user["message"])
        total = flight["economy_price"] if cabin == "Economy Class" else flight["business_price"]
        total += self.calculate_baggage_fee(user["membership_level"], cabin, baggage_count)
        if payment_method not in ("cash", "bank"):
            return "Invalid payment method"
        account = f"{payment_method}_balance"
        if total > user[account]:
            return f"Your {payment_method} balance is insufficient. Please consider using another payment method."
        user[account] -= total
        flight["seats_available"] -= 1
        reservation_id = f"res_{len(self.reservations) + 1}"
        self.reservations.append({"reservation_id": reservation_id, "user_id": user_id, "flight_no": flight_no,
                                  "payment_method": payment_method, "cabin": cabin, "baggage": baggage_count})
        return f"Booking successful. Reservation ID: {reservation_id}. Total cost: {total} yuan (including baggage fees)."

    def modify_flight(self, user_id, reservation_id, new_flight_no=None, new_cabin=None, add_baggage=0,
                      new_payment_method=None):
        reservation = self._reservation(user_id, reservation_id)
        if reservation is None:
            return "Reservation not found or user ID does not match."
        old_flight = self._flight(reservation["flight_no"])
        if old_flight is None:
            return "Flight information not found."
        payment = new_payment_method or reservation["payment_method"]
        user = self.users[user_id]
        done = []
        if new_flight_no and new_flight_no != reservation["flight_no"]:
            new_flight = self._flight(new_flight_no)
            if not new_flight or (new_flight["origin"], new_flight["destination"]) != (
                    old_flight["origin"], old_flight["destination"]):
                return "Flight change failed: Invalid new flight number or destination does not match."
            reservation["flight_no"] = new_flight_no
            done.append("Flight number has been changed.")
        if new_cabin and new_cabin != reservation.get("cabin"):
            prices = {"Economy Class": old_flight["economy_price"], "Business Class": old_flight["business_price"]}
            difference = prices.get(new_cabin, 0) - prices.get(reservation["cabin"], 0)
            reservation["cabin"] = new_cabin
            if difference > 0:
                done.append(f"Cabin change successful. Price difference paid: {difference}."
                            if _pay(user, payment, difference) else
                            "Insufficient balance to pay the cabin price difference.")
            elif difference < 0:
                _pay(user, payment, difference)
                done.append(f"Cabin change successful. Price difference refunded: {-difference}.")
        if add_baggage > 0:
            bags = reservation.get("baggage", 0) + add_baggage
            fee = max(0, bags - self.get_baggage_allowance(user["membership_level"], reservation["cabin"])) * BAG_FEE
            if fee > 0:
                done.append(f"Baggage has been added. Additional fee to be paid: {fee}." if _pay(user, payment, fee)
                            else "Insufficient balance to pay the additional baggage fees.")
            reservation["baggage"] = bags
        return " ".join(done) or "Modification completed with no additional fees."

    def cancel_reservation(self, user_id, reservation_id, reason):
        user = self.users.get(user_id)
        if not user:
            return "Invalid user ID."
        reservation = self._reservation(user_id, reservation_id)
        if reservation is None:
            return "Invalid reservation ID or it does not belong to the user."
        flight = self._flight(reservation["flight_no"])
        if flight is None:
            return "Invalid flight information."
        departure = _time(flight["depart_time"])
        if TRAVEL_NOW > departure:
            return "The flight segment has been used and cannot be canceled."
        price = flight["economy_price"] if reservation["cabin"] == "Economy Class" else flight["business_price"]
        if reason == AIRLINE_CANCELLED:
            user["cash_balance"] += price
            return (f"The flight has been canceled. Your reservation will be canceled free of charge, and {price} yuan "
                    "has been refunded.")
        if departure - TRAVEL_NOW > datetime.timedelta(days=1):
            user["cash_balance"] += price
            return f"More than 24 hours before departure. Free cancellation successful, {price} yuan has been refunded."
        fee = price * 0.1
        user["cash_balance"] += price - fee
        return (f"Less than 24 hours before departure. A cancellation fee of {fee} yuan has been deducted, and "
                f"{price - fee} yuan has been refunded.")

    def _flight(self, flight_no) -> dict | None:
        return next((f for f in self.flights if f["flight_no"] == flight_no), None)

    def _reservation(self, user_id, reservation_id) -> dict | None:
        return next((r for r in self.reservations
                     if r["reservation_id"] == reservation_id and r["user_id"] == user_id), None)


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S")


def _pay(user: dict, method: str, amount) -> bool:
    """Takes ``amount`` (a refund when negative) from the user's cash or bank balance if it covers it."""
    account = f"{method}_balance"
    if account not in user:
        return True  # upstream charges nothing for an unknown payment method
    if user[account] - amount < 0:
        return False
    user[account] -= amount
    return True


CLASSES = {cls.__name__: cls for cls in (BaseApi, MessageApi, ReminderApi, FoodPlatform, Travel)}
SAVED_ATTRIBUTES = {"BaseApi": ("wifi", "logged_in"), "MessageApi": ("inbox",), "ReminderApi": ("reminder_list",),
                    "FoodPlatform": ("users", "logged_in_users", "orders"), "Travel": ("users", "reservations")}


class Scenario:
    """One item's API instances: created at the first executed reply (as upstream creates them),
    each loaded with its own config and then the BaseApi config of ``initial_config``."""

    def __init__(self, involved_classes: list[str], initial_config: dict):
        unknown = [name for name in involved_classes if name not in CLASSES]
        if unknown:
            raise ValueError(f"no simulated API class {unknown}")
        self.involved_classes = list(involved_classes)
        self.initial_config = copy.deepcopy(initial_config)
        self.instances: dict[str, Any] | None = None

    def run(self, calls: list[dict]) -> list:
        """Executes parsed calls ``[{name: {keyword: literal}}]`` in order; one result each. A name
        that several instances have (``turn_on_wifi``) runs on every one of them, in the order of
        ``involved_classes``; the result shown is the last one's."""
        if self.instances is None:
            self.instances = {}
            for name in self.involved_classes:
                instance = CLASSES[name]()
                instance._load_scenario(copy.deepcopy(self.initial_config.get(name, {})))
                instance._load_scenario(copy.deepcopy(self.initial_config.get("BaseApi", {})))
                self.instances[name] = instance
        results = []
        for call in calls:
            (name, arguments), = call.items()
            methods = [getattr(instance, name) for instance in self.instances.values()
                       if name in public_methods(type(instance))]
            if not methods:
                results.append(f"Error during execution: no API named {name!r} in this scenario")
                continue
            try:
                for method in methods:
                    result = method(**arguments)
            except Exception as err:  # noqa: BLE001 - the simulated API's failure is the call's result
                result = f"Error during execution: {err}"
            results.append(result)
        return results

    def state(self) -> list[dict]:
        """The saved attributes of every class, as upstream writes them to its result file (JSON:
        integer keys become strings); empty when no reply was ever executed."""
        if self.instances is None:
            return []
        return [{name: json.loads(json.dumps({key: getattr(instance, key) for key in SAVED_ATTRIBUTES[name]}))}
                for name, instance in self.instances.items()]


def public_methods(cls: type) -> frozenset[str]:
    """The names a reply may call on ``cls``: its methods not starting with an underscore."""
    return frozenset(name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_"))
