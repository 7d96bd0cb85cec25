// A real HDFS for tests: Hadoop's MiniDFSCluster (one NameNode, one DataNode) on
// 127.0.0.1 with WebHDFS, started by localstate.testing.hdfs (which compiles this file
// against the Hadoop jars it fetched with Maven).
//
// Usage: java -cp <classes>:<hadoop classpath> MiniHdfs <data dir> <ports file> [key=value ...]
// Writes "webhdfs=<NameNode HTTP port>" and "rpc=<NameNode RPC port>" to <ports file>
// (atomically, once the cluster is up), prints the same, and stops the cluster when its
// standard input reaches EOF (the test process ended, however it ended) or on SIGTERM.
// Each key=value is set in the cluster's Hadoop configuration (after the defaults here).

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public final class MiniHdfs {
    private MiniHdfs() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: MiniHdfs <data dir> <ports file> [key=value ...]");
            System.exit(2);
        }
        File base = new File(args[0]).getAbsoluteFile();
        Path ports = new File(args[1]).getAbsoluteFile().toPath();

        Configuration conf = new Configuration();
        conf.set("hdfs.minidfs.basedir", base.getPath());
        // every server socket on the loopback address, on a free port
        conf.set("dfs.namenode.http-address", "127.0.0.1:0");
        conf.set("dfs.datanode.http.address", "127.0.0.1:0");
        conf.set("dfs.datanode.address", "127.0.0.1:0");
        conf.set("dfs.datanode.ipc.address", "127.0.0.1:0");
        conf.setBoolean("dfs.webhdfs.enabled", true);
        for (int i = 2; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) {
                System.err.println("not key=value: " + args[i]);
                System.exit(2);
            }
            conf.set(args[i].substring(0, eq), args[i].substring(eq + 1));
        }

        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf).numDataNodes(1).build();
        Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));
        cluster.waitActive();

        String text = "webhdfs=" + cluster.getNameNode().getHttpAddress().getPort() + "\n"
                + "rpc=" + cluster.getNameNodePort() + "\n";
        Path tmp = ports.resolveSibling(ports.getFileName() + ".tmp");
        Files.write(tmp, text.getBytes(StandardCharsets.UTF_8));
        Files.move(tmp, ports, StandardCopyOption.ATOMIC_MOVE);
        System.out.print(text);
        System.out.flush();

        while (System.in.read() != -1) {
            // wait for EOF: the parent closed our standard input or died
        }
        System.exit(0);  // runs the shutdown hook
    }
}
