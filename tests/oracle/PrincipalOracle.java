// Ground truth for Sluice's principal code, from the JDK and Kafka themselves (see
// tests/unit/protocol/test_principal_oracle.py). Reads one request per line on stdin:
//   subject <path of a DER certificate>   -> X500Principal.getName() of its subject
//   map <rules> TAB <dn>                  -> SslPrincipalMapper.fromRules(rules).getName(dn)
// and prints one answer per line: "ok <value>" or "error <exception class>".
import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;

import org.apache.kafka.common.security.ssl.SslPrincipalMapper;

public class PrincipalOracle {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        CertificateFactory factory = CertificateFactory.getInstance("X.509");
        String line;
        while ((line = in.readLine()) != null) {
            try {
                if (line.startsWith("subject ")) {
                    try (FileInputStream f = new FileInputStream(line.substring(8))) {
                        X509Certificate cert = (X509Certificate) factory.generateCertificate(f);
                        System.out.println("ok " + escape(cert.getSubjectX500Principal().getName()));
                    }
                } else if (line.startsWith("map ")) {
                    String[] parts = line.substring(4).split("\t", 2);
                    System.out.println("ok " + escape(SslPrincipalMapper.fromRules(parts[0]).getName(parts[1])));
                } else {
                    System.out.println("error unknown-request");
                }
            } catch (Exception e) {
                System.out.println("error " + e.getClass().getSimpleName());
            }
            System.out.flush();
        }
    }

    // one answer per line: backslash-n, backslash-r and two backslashes stand for CR, LF and a backslash
    private static String escape(String s) {
        return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r");
    }
}
