/* Sluice's stand-in for spark-token-provider-kafka-0-10's KafkaTokenUtil (see KafkaConfigUpdater). */
package org.apache.spark.kafka010;

import java.util.Map;

public final class KafkaTokenUtil$ {
    public static final KafkaTokenUtil$ MODULE$ = new KafkaTokenUtil$();

    private KafkaTokenUtil$() {
    }

    /** No delegation-token cluster is ever configured. */
    public scala.Option<KafkaTokenClusterConf> findMatchingTokenClusterConfig(
            org.apache.spark.SparkConf sparkConf, String bootstrapServers) {
        return scala.Option.empty();
    }

    public boolean needTokenUpdate(Map<String, Object> params, scala.Option<KafkaTokenClusterConf> clusterConfig) {
        return false;
    }
}
