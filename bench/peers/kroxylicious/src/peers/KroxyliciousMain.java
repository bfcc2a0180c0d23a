package peers;

import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;

import io.kroxylicious.proxy.KafkaProxy;
import io.kroxylicious.proxy.config.ConfigParser;
import io.kroxylicious.proxy.config.Configuration;
import io.kroxylicious.proxy.internal.config.Features;

/** What io.kroxylicious.app.Kroxylicious (0.12.0) does, minus picocli and the banner:
 *  parse the YAML config, start KafkaProxy, block until it is shut down. */
public final class KroxyliciousMain {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: KroxyliciousMain <config.yaml>");
            System.exit(2);
        }
        ConfigParser parser = new ConfigParser();
        Configuration config;
        try (InputStream in = Files.newInputStream(Path.of(args[0]))) {
            config = parser.parseConfiguration(in);
        }
        try (KafkaProxy proxy = new KafkaProxy(parser, config, Features.defaultFeatures())) {
            proxy.startup();
            proxy.block();
        }
    }
}
