// One member of a Kafka share group (KIP-932) for the integration tests (tests/harness/share.py),
// run from the Kafka client jars the broker tests use: `java -cp <kafka libs>/* ShareGroupMember.java`.
//
// Args: bootstrap group topic client-id leave-after
//   Sets the group's share.auto.offset.reset=earliest, subscribes, and polls with explicit
//   acknowledgement: every record is accepted and committed (commitSync), and printed once its
//   acknowledgement succeeded:            acc <partition> <offset> <delivery count> <value>
//   With leave-after >= 0, the batch that brings the member to leave-after records is accepted up
//   to leave-after (all but its last record at most) and the rest is NOT acknowledged: those are
//   printed                                  held <partition> <offset> <delivery count> <value>
//   and the member closes (its acquired records go back to the group for redelivery). So it leaves
//   as soon as it has been given leave-after records, however the broker batches them (the same
//   rule as tests/harness/share.py's split_for_leaving).
//   Otherwise it runs until a line "stop" (or EOF) arrives on stdin, then closes.
// Also prints "ready" once subscribed, "closed" at the end, and the highest throttle time its
// share fetches reported: "throttle-max <ms>".
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.config.ConfigResource;

public class ShareGroupMember {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], topic = args[2], clientId = args[3];
        int leaveAfter = Integer.parseInt(args[4]);
        Properties admin = new Properties();
        admin.put("bootstrap.servers", bootstrap);
        try (Admin a = Admin.create(admin)) {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
            AlterConfigOp op = new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
                                                 AlterConfigOp.OpType.SET);
            a.incrementalAlterConfigs(Map.of(resource, List.of(op))).all().get();
        }
        AtomicBoolean stop = new AtomicBoolean(false);
        Thread stdin = new Thread(() -> {
            try (java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in))) {
                String line;
                while ((line = in.readLine()) != null && !line.trim().equals("stop")) { }
            } catch (java.io.IOException ignored) { }
            stop.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();

        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("client.id", clientId);
        props.put("share.acknowledgement.mode", "explicit");
        props.put("max.poll.records", "100");
        props.put("key.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        props.put("value.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        int accepted = 0;
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props)) {
            consumer.subscribe(List.of(topic));
            System.out.println("ready");
            System.out.flush();
            while (!stop.get()) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                if (records.isEmpty()) continue;
                List<ConsumerRecord<String, String>> batch = new ArrayList<>();
                records.forEach(batch::add);
                int take = batch.size();
                if (leaveAfter >= 0 && accepted + batch.size() >= leaveAfter) {
                    take = Math.max(0, Math.min(leaveAfter - accepted, batch.size() - 1));
                }
                List<ConsumerRecord<String, String>> accept = batch.subList(0, take);
                List<ConsumerRecord<String, String>> held = batch.subList(take, batch.size());
                if (!accept.isEmpty()) {
                    for (ConsumerRecord<String, String> r : accept) {
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                    }
                    Map<TopicIdPartition, Optional<KafkaException>> result = consumer.commitSync();
                    Set<Integer> failed = new HashSet<>();
                    for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : result.entrySet()) {
                        if (e.getValue().isPresent()) {
                            failed.add(e.getKey().partition());
                            System.out.println("ack-error " + e.getKey() + " " + e.getValue().get());
                        }
                    }
                    for (ConsumerRecord<String, String> r : accept) {
                        if (!failed.contains(r.partition())) {
                            System.out.println("acc " + line(r));
                            accepted++;
                        }
                    }
                }
                if (!held.isEmpty()) {
                    for (ConsumerRecord<String, String> r : held) {
                        System.out.println("held " + line(r));
                    }
                    System.out.flush();
                    break;  // close without acknowledging them: the broker releases them to the group
                }
                System.out.flush();
            }
            double throttleMax = 0;
            for (Map.Entry<MetricName, ? extends Metric> m : consumer.metrics().entrySet()) {
                if (m.getKey().name().equals("fetch-throttle-time-max")) {
                    Object v = m.getValue().metricValue();
                    if (v instanceof Double d && !d.isNaN()) throttleMax = Math.max(throttleMax, d);
                }
            }
            System.out.println("throttle-max " + (long) throttleMax);
        }
        System.out.println("closed");
        System.out.flush();
    }

    private static String line(ConsumerRecord<String, String> r) {
        return r.partition() + " " + r.offset() + " " + r.deliveryCount().orElse((short) -1) + " " + r.value();
    }
}
