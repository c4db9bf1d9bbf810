"""rmqdump on Spark: the ``rocketmq`` / ``rocketmq_cq`` / ``rocketmq_index`` data sources, a quiet
session builder and the export/verify/stats/lookup jobs. The only package that imports pyspark.

    from rmqdump.spark import build_session
    spark = build_session("local[*]")
    df = spark.read.format("rocketmq").option("includeBody", "true").load(["/data/a/store", "/data/b/store"])

In a session of your own: ``from rmqdump.spark import register_data_sources; register_data_sources(spark)``.
"""

from __future__ import annotations

__all__ = ["build_session", "register_data_sources"]


def __getattr__(name: str):
    if name == "build_session":
        from rmqdump.spark.session import build_session
        return build_session
    if name == "register_data_sources":
        from rmqdump.spark.datasource import register_data_sources
        return register_data_sources
    raise AttributeError(name)
