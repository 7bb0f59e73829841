"""Example policies for the support-desk suite: observation in, next action out."""


def list_then_answer(observation, last_step):
    """List the accounts, then answer with their ids."""
    if last_step is None:
        return {"type": "tool", "name": "crm.list_accounts", "args": {}}
    ids = ", ".join(account["id"] for account in observation)
    return {"type": "terminate", "output": f"Accounts: {ids}"}
