"""Fixture CRM for the support-desk world: JSON arguments on stdin, JSON on stdout."""

import json
import os
import sys

ACCOUNTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accounts.json")


def main(command):
    args = json.load(sys.stdin)
    with open(ACCOUNTS) as f:
        accounts = json.load(f)
    if command == "get_account":
        account = accounts.get(args["id"])
        if account is None:
            sys.stderr.write("no account %s\n" % args["id"])
            return 2
        json.dump(dict(account, id=args["id"]), sys.stdout)
    elif command == "list_accounts":
        json.dump([{"id": key, "name": value["name"]} for key, value in sorted(accounts.items())], sys.stdout)
    else:
        sys.stderr.write("unknown command %s\n" % command)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
