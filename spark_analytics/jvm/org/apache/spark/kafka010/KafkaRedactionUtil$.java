/* Sluice's stand-in for spark-token-provider-kafka-0-10's KafkaRedactionUtil (see KafkaConfigUpdater). */
package org.apache.spark.kafka010;

import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;

public final class KafkaRedactionUtil$ {
    public static final KafkaRedactionUtil$ MODULE$ = new KafkaRedactionUtil$();
    private static final Pattern SECRET_KEY = Pattern.compile("(?i)secret|password|token|jaas|credential");
    private static final String REDACTED = "*********(redacted)";

    private KafkaRedactionUtil$() {
    }

    /** Used only for log lines: hides every value whose key looks like a credential. */
    public scala.collection.immutable.Seq<scala.Tuple2<String, String>> redactParams(
            scala.collection.immutable.Seq<scala.Tuple2<String, Object>> params) {
        List<scala.Tuple2<String, String>> out = new ArrayList<>();
        for (scala.Tuple2<String, Object> kv : scala.jdk.javaapi.CollectionConverters.asJava(params)) {
            Object value = kv._2();
            String shown = value == null ? null
                : SECRET_KEY.matcher(kv._1()).find() ? REDACTED : value.toString();
            out.add(new scala.Tuple2<>(kv._1(), shown));
        }
        return scala.jdk.javaapi.CollectionConverters.asScala(out).toList();
    }
}
