from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from shop.agents import order_helper
from shop.models import Order
from threads_celery.contrib.django import get_threads

OUT_OF_STOCK = {"unicorn"}


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    item = request.POST.get("item", "").strip()
    if not item:
        return JsonResponse({"error": "item is required"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(item=item)
        run = get_threads().start(order_helper, f"Confirm order {order.pk}: {item}", within=connection)
        order.run_id = run.run_id
        order.save(update_fields=["run_id"])
        if item in OUT_OF_STOCK:  # found out after the start: the order and its run both vanish
            transaction.set_rollback(True)
            return JsonResponse({"error": f"{item} is out of stock", "run_id": run.run_id}, status=409)
    return JsonResponse({"order": order.pk, "run_id": run.run_id}, status=201)
