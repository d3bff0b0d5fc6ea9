from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    run_id = models.CharField(max_length=64, blank=True)
