"""The demos (``rayconnect demo``, ``demo --database``, ``demo --source``), their workloads
(the database mirror's shop, a local PostgreSQL) and the chaos they inflict (actor kills):
what shows the product working, kept apart from it. The core never imports this package
(a shape test says so); the command line, the tests and the benchmarks do."""
