"""Spark orchestration that never sees a record: options, session, executor probe and package
shipping (:mod:`dpsummary.spark.session`), and opening a release's Spark source
(:mod:`dpsummary.spark.launch`). The Spark passes that read records are in
:mod:`dpsummary.private.spark_engine`."""
