//! The harness itself works: a cluster starts with logical decoding, databases are separate.

use ferry_testkit::pg;

#[tokio::test]
async fn shared_cluster_has_logical_wal_and_separate_databases() {
    let a = pg::shared().create_db().await;
    let b = pg::shared().create_db().await;
    assert_ne!(a.name, b.name);
    let c = a.client().await;
    let row = c.query_one("SHOW wal_level", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "logical");
    let row = c.query_one("SELECT current_database()", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), a.name);
}

#[tokio::test]
async fn private_cluster_restarts_on_the_same_port() {
    let cluster = pg::PgCluster::start(pg::ClusterOptions::default()).await;
    let url = cluster.url("postgres");
    let c = pg::connect(&url).await;
    c.batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    drop(c);
    cluster.stop(true);
    assert!(tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .is_err());
    cluster.start_again();
    let c = pg::connect(&url).await;
    let n: i64 = c
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

/// A Kafka node whose port was taken between finding it free and binding it stops at start:
/// the cluster is started again with other ports, and a port that stays taken (here node 1's,
/// held throughout) is said after the last attempt.
#[cfg(feature = "kafka")]
#[test]
#[should_panic(expected = "node 1 could not bind its port (Address already in use), 3 times")]
fn a_kafka_node_whose_port_is_taken_is_started_again_then_said() {
    use ferry_testkit::kafka;
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let _cluster = kafka::LocalBroker::start_blocking_with(kafka::ClusterOptions {
        port: Some(port),
        ..Default::default()
    });
}
