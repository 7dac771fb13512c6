// The local broker's request counts, read over JMX: one JSON line on stdout for each line read
// on stdin, {"Produce": n, "Fetch": n, ...} (the broker's RequestsPerSec counts, summed over
// the request's versions), until stdin closes. Run as a single-file source program
// (`java BrokerRequests.java PORT`, a JDK's `java`) by bench/broker_requests.py.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Map;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerRequests {
  public static void main(String[] args) throws Exception {
    JMXServiceURL url = new JMXServiceURL(
        "service:jmx:rmi:///jndi/rmi://127.0.0.1:" + args[0] + "/jmxrmi");
    try (JMXConnector connector = JMXConnectorFactory.connect(url)) {
      MBeanServerConnection server = connector.getMBeanServerConnection();
      ObjectName pattern =
          new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*");
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
      while (in.readLine() != null) {
        Map<String, Long> counts = new TreeMap<>();
        for (ObjectName name : server.queryNames(pattern, null)) {
          Object count = server.getAttribute(name, "Count");
          if (count instanceof Number) {
            counts.merge(name.getKeyProperty("request"), ((Number) count).longValue(), Long::sum);
          }
        }
        StringBuilder line = new StringBuilder("{");
        for (Map.Entry<String, Long> e : counts.entrySet()) {
          if (line.length() > 1) line.append(',');
          line.append('"').append(e.getKey()).append("\":").append(e.getValue());
        }
        System.out.println(line.append('}'));
        System.out.flush();
      }
    }
  }
}
