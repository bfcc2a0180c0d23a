/* Sluice's stand-in (see KafkaConfigUpdater): the type exists, no instance is ever made. */
package org.apache.spark.kafka010;

public final class KafkaTokenClusterConf {
    private KafkaTokenClusterConf() {
    }
}
