import pytest

from shop.agents import order_helper
from threads_celery.contrib.django.testing import AgentTestCase


class OrderHelperTests(AgentTestCase):
    agents = (order_helper,)

    def test_the_helper_confirms_the_order(self) -> None:
        handle = self.threads.start(order_helper, "Confirm order 1: a book")
        run = self.threads.wait(handle.run_id, timeout=30)
        self.assertEqual(run.output, "Your order is confirmed.")


# Under pytest (pytest-django), the plugin's fixtures as well.
@pytest.fixture
def threads_agents():
    return [order_helper]


def test_the_helper_confirms_the_order_with_the_plugins_fixture(threads) -> None:
    run = threads.wait(threads.start("order_helper", "Confirm order 2: a pen").run_id, timeout=30)
    assert run.output == "Your order is confirmed."
