from threads_celery import Agent
from threads_celery.testing import ScriptedModel, say

order_helper = Agent(
    name="order_helper",
    instructions="Confirm the order to the customer.",
    model=ScriptedModel([say("Your order is confirmed.")]),
)
