/*
 * Sluice's stand-in for spark-token-provider-kafka-0-10's KafkaConfigUpdater.
 *
 * spark-sql-kafka-0-10 depends on spark-token-provider-kafka-0-10, which Maven Central does not
 * serve here. The connector only uses the four classes in this package; these implementations
 * keep the connector working for clients configured through `kafka.*` options (PLAINTEXT, SASL
 * with an explicit sasl.jaas.config) and refuse Spark's Kafka delegation tokens, which they do not
 * implement. With the real artifact on the classpath this code is not built or used.
 */
package org.apache.spark.kafka010;

import java.util.HashMap;
import java.util.Map;

public class KafkaConfigUpdater {
    private final String module;
    private final Map<String, Object> map;

    public KafkaConfigUpdater(String module, scala.collection.immutable.Map<String, Object> kafkaParams) {
        this.module = module;
        this.map = new HashMap<>(scala.jdk.javaapi.CollectionConverters.asJava(kafkaParams));
    }

    public KafkaConfigUpdater set(String key, Object value) {
        map.put(key, value);
        return this;
    }

    public KafkaConfigUpdater setIfUnset(String key, Object value) {
        map.putIfAbsent(key, value);
        return this;
    }

    /** No delegation tokens: the `kafka.*` options (or a JVM-wide JAAS file) configure security. */
    public KafkaConfigUpdater setAuthenticationConfigIfNeeded() {
        return this;
    }

    public KafkaConfigUpdater setAuthenticationConfigIfNeeded(scala.Option<?> clusterConfig) {
        if (clusterConfig.isDefined()) {
            throw new UnsupportedOperationException(
                module + ": Kafka delegation tokens need spark-token-provider-kafka-0-10 on the classpath");
        }
        return this;
    }

    public Map<String, Object> build() {
        return map;
    }
}
