/*
 * rmqdump bench reference: RocketMQ's own DefaultMessageStore.load() (recovery, CRC on) over a store,
 * timed inside the JVM. Compiled by bench/references.py against ../shared/oracle/498's classpath.
 * usage: LoadTime STORE COMMITLOG_FILE_SIZE CQ_FILE_SIZE  -> prints "load_ok=<bool> load_ms=<ms>"
 * Opens STORE read-write as a broker does: run it on a copy.
 */
import java.io.File;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.config.MessageStoreConfig;

public class LoadTime {
    public static void main(String[] a) throws Exception {
        String root = new File(a[0]).getAbsolutePath();
        MessageStoreConfig cfg = new MessageStoreConfig();
        cfg.setStorePathRootDir(root);
        cfg.setStorePathCommitLog(root + File.separator + "commitlog");
        cfg.setMappedFileSizeCommitLog(Integer.parseInt(a[1]));
        cfg.setMappedFileSizeConsumeQueue(Integer.parseInt(a[2]));
        cfg.setCheckCRCOnRecover(true);
        DefaultMessageStore store = new DefaultMessageStore(cfg, null, null, new BrokerConfig());
        long t0 = System.nanoTime();
        boolean ok = store.load();
        long t1 = System.nanoTime();
        System.out.println("load_ok=" + ok + " load_ms=" + (t1 - t0) / 1e6);
        store.shutdown();
        System.exit(ok ? 0 : 2);
    }
}
