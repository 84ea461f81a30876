//! Redis Cluster connections (`redis-cluster://`): redis-rs' cluster client,
//! which follows MOVED/ASK, retries TRYAGAIN and reconnects to nodes, with
//! retry waits short enough for slot migrations (see docs/SCALE-OUT.md).

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::RedisResult;

use super::{invalid_url, split_userinfo, ConnectionConfig};

/// `rest` is the URL after `redis-cluster://`: `[user:pass@]h1:p1,h2:p2[/]`.
pub(super) async fn connect_cluster(
    rest: &str,
    cfg: &ConnectionConfig,
) -> RedisResult<ClusterConnection> {
    let (userinfo, hosts) = split_userinfo(rest);
    let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| match userinfo {
            Some(u) => format!("redis://{u}@{n}/"),
            None => format!("redis://{n}/"),
        })
        .collect();
    if nodes.is_empty() {
        return Err(invalid_url(
            "a cluster URL names at least one node: redis-cluster://host:port[,host:port]",
        ));
    }
    // Retries after MOVED/ASK are immediate; TRYAGAIN (a slot being
    // migrated), CLUSTERDOWN and lost nodes are retried with a short
    // jittered exponential wait (10 ms doubling, at most 500 ms per wait) —
    // the client's default minimum of 1.28 s per retry would stall a worker
    // for seconds on every slot migration. The whole request, retries
    // included, is bounded by `response_timeout`.
    let client = ClusterClientBuilder::new(nodes)
        .connection_timeout(cfg.connection_timeout)
        .response_timeout(cfg.response_timeout)
        .overall_response_timeout(Some(cfg.response_timeout))
        .retries(32)
        .min_retry_wait(10)
        .max_retry_wait(500)
        .retry_wait_formula(10, 2)
        .build()?;
    client.get_async_connection().await
}
